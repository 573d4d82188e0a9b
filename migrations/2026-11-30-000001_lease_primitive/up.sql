-- leasehold v1: the lease primitive (schema `lease`).
--
-- Behaviour: SPEC §1. Every function is SECURITY DEFINER with
-- search_path pinned to pg_catalog then pg_temp (pg_temp named last so it can
-- never shadow anything; left out, PostgreSQL would search it first), and every
-- object reference is schema-qualified, so objects a caller creates in
-- `public` or in a temporary schema cannot hijack the functions.
--
-- Common paths are one row-level write statement (a conditional UPDATE, or an
-- INSERT for a never-seen key); the reason for a refusal is looked up only
-- when the write did not apply.

CREATE SCHEMA IF NOT EXISTS lease;
REVOKE ALL ON SCHEMA lease FROM PUBLIC;
GRANT USAGE ON SCHEMA lease TO PUBLIC;

-- The digest that indexes a key (see lease.leases.key_hash). convert_to is
-- marked STABLE only because encoding conversions are catalog objects; a
-- database's encoding never changes, so the digest of a key never does.
CREATE FUNCTION lease._key_hash(key text)
RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT pg_catalog.sha256(pg_catalog.convert_to($1, 'UTF8')) $$;

-- One row per key ever leased.
--   owner/expires_at: the current or last grant; both NULL when FREE (released).
--   epoch: the key's fencing counter. It equals the current grant's epoch while
--          a grant exists (held or lapsed) and is one higher after a release.
--   lapsed_owner: when the current grant took over a grant that had lapsed,
--          that grant's owner, so it hears `lapsed` (SPEC §1.3 rule 2).
--   key_hash: SHA-256 of the key (lease._key_hash), the primary key. A btree
--          entry is limited to about 2.7 kB, so indexing the key itself would
--          refuse long keys; the digest keeps any key length working at a
--          fixed index width. Lookups compare the digest and then the key.
--          A plain column set by the functions (the only writers), not a
--          generated one: each call computes the digest once, and no UPDATE
--          recomputes it.
CREATE TABLE lease.leases (
    key          text        NOT NULL,
    key_hash     bytea       PRIMARY KEY,
    owner        text,
    epoch        bigint      NOT NULL,
    expires_at   timestamptz,
    lapsed_owner text
);
-- Invariants kept by the functions, the table's only writers: epoch >= 1,
-- and owner and expires_at are both NULL or both set. They are not CHECK
-- constraints because PostgreSQL re-reads and re-plans a table's CHECK
-- expressions on every UPDATE execution, measurably slowing every call.
REVOKE ALL ON TABLE lease.leases FROM PUBLIC;

-- Internal helpers (names starting with `_`) are REVOKEd from PUBLIC and run
-- only inside the API functions, whose pinned search_path they inherit; they
-- carry no SET clause of their own because a per-call SET costs a GUC save
-- and restore on every call.

-- Validation shared by every function, called only when the API function's
-- inline check found something wrong. Returns the violated constraints, each
-- phrased as what the caller must do; an empty array means the input is fine.
CREATE FUNCTION lease._violations(
    p_key text, p_check_owner boolean, p_owner text,
    p_check_ttl boolean, p_ttl interval,
    p_check_wait boolean, p_wait interval,
    p_check_epoch boolean, p_epoch bigint)
RETURNS text[]
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v text[] := '{}';
BEGIN
    IF p_key IS NULL THEN
        v := v || 'key must not be NULL'::text;
    ELSIF p_key = '' THEN
        v := v || 'key must not be empty'::text;
    END IF;
    IF p_check_owner THEN
        IF p_owner IS NULL THEN
            v := v || 'owner must not be NULL'::text;
        ELSIF p_owner = '' THEN
            v := v || 'owner must not be empty'::text;
        END IF;
    END IF;
    IF p_check_ttl THEN
        IF p_ttl IS NULL THEN
            v := v || 'ttl must not be NULL'::text;
        ELSIF p_ttl <= interval '0' THEN
            v := v || 'ttl must be positive'::text;
        ELSIF p_ttl > interval '100 years' THEN
            v := v || 'ttl must be at most 100 years'::text;
        END IF;
    END IF;
    IF p_check_wait THEN
        IF p_wait IS NULL THEN
            v := v || 'wait must not be NULL'::text;
        ELSIF p_wait < interval '0' THEN
            v := v || 'wait must not be negative'::text;
        ELSIF p_wait > interval '100 years' THEN
            v := v || 'wait must be at most 100 years'::text;
        END IF;
    END IF;
    IF p_check_epoch AND p_epoch IS NULL THEN
        v := v || 'epoch must not be NULL'::text;
    END IF;
    RETURN v;
END;
$$;

-- Raises invalid_input (SQLSTATE 22023) naming every violation; the stable
-- machine-readable name travels in the CONSTRAINT field.
CREATE FUNCTION lease._raise_invalid(p_function text, p_violations text[])
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    RAISE EXCEPTION 'invalid input to lease.%: %', p_function, array_to_string(p_violations, '; ')
        USING ERRCODE = '22023',
              CONSTRAINT = 'lease_invalid_input',
              DETAIL = array_to_string(p_violations, '; '),
              HINT = 'Pass a non-empty key and owner, a positive ttl, a non-negative wait and a non-NULL epoch.';
END;
$$;

-- Status of a renew/release that did not apply, computed on the locked row,
-- SPEC §1.3 precedence: not_owner, then lapsed, then epoch_mismatch. Returns
-- 'ok' when the row (now locked) does match, so the caller can apply.
CREATE FUNCTION lease._status_locked(p_hash bytea, p_key text, p_owner text, p_epoch bigint)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_row record;
BEGIN
    SELECT l.owner, l.epoch, l.expires_at, l.lapsed_owner INTO v_row
      FROM lease.leases AS l
     WHERE l.key_hash = p_hash AND l.key = p_key
       FOR NO KEY UPDATE;
    IF NOT FOUND OR v_row.owner IS NULL THEN
        RETURN 'not_owner';
    END IF;
    IF v_row.owner <> p_owner THEN
        IF v_row.lapsed_owner = p_owner THEN
            RETURN 'lapsed';
        END IF;
        RETURN 'not_owner';
    END IF;
    IF v_row.expires_at <= clock_timestamp() THEN
        RETURN 'lapsed';
    END IF;
    IF v_row.epoch <> p_epoch THEN
        RETURN 'epoch_mismatch';
    END IF;
    RETURN 'ok';
END;
$$;

CREATE FUNCTION lease.acquire(key text, owner text, ttl interval, wait interval DEFAULT '0')
RETURNS TABLE (acquired boolean, epoch bigint, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_hash bytea;
    v_now timestamptz;
    v_deadline timestamptz;
    v_row record;
    v_attempts integer := 0;
    v_outcome text;
    v_epoch bigint;
    v_expires timestamptz;
BEGIN
    IF $1 IS NULL OR $1 = '' OR $2 IS NULL OR $2 = ''
       OR $3 IS NULL OR $3 <= interval '0' OR $3 > interval '100 years'
       OR $4 IS NULL OR $4 < interval '0' OR $4 > interval '100 years' THEN
        PERFORM lease._raise_invalid('acquire', lease._violations($1, true, $2, true, $3, true, $4, false, NULL));
    END IF;
    v_hash := pg_catalog.sha256(pg_catalog.convert_to($1, 'UTF8'));
    IF $4 > interval '0' THEN
        v_deadline := clock_timestamp() + $4;
    END IF;
    <<attempt>>
    LOOP
        -- Each pass sees a newer state than the last; a key cannot keep
        -- changing under us for ever. The bound turns an impossible endless
        -- loop into an error instead of a hung session.
        v_attempts := v_attempts + 1;
        IF v_attempts > 100000 THEN
            RAISE EXCEPTION 'lease.acquire could not settle the state of key % after % attempts', $1, v_attempts
                USING ERRCODE = '40001', CONSTRAINT = 'lease_contention', HINT = 'Retry the call.';
        END IF;
        v_outcome := NULL;
        -- One attempt runs in a subtransaction that is rolled back when it
        -- does not grant. Why: when the UPDATE below meets a row another
        -- transaction is changing, PostgreSQL waits, locks the newest version
        -- and re-checks the condition; if the re-check fails, that lock would
        -- otherwise stay until the caller's transaction ends, so a denied
        -- acquire (or a waiting one, for its whole wait) could block the
        -- holder's renew and release. Rolling back the attempt releases it.
        BEGIN
            v_now := clock_timestamp();
            -- Common path: the key exists and is FREE or LAPSED. The counter
            -- moves on by one; a lapsed grant's owner is remembered for rule 2.
            UPDATE lease.leases AS l
               SET owner = $2,
                   epoch = l.epoch + 1,
                   expires_at = v_now + $3,
                   lapsed_owner = l.owner
             WHERE l.key_hash = v_hash AND l.key = $1
               AND (l.owner IS NULL OR l.expires_at <= v_now)
            RETURNING l.epoch, l.expires_at INTO v_epoch, v_expires;
            IF FOUND THEN
                v_outcome := 'granted';
            ELSE
                -- Never-seen key: the first grant is epoch 1.
                INSERT INTO lease.leases AS l (key, key_hash, owner, epoch, expires_at, lapsed_owner)
                VALUES ($1, v_hash, $2, 1, v_now + $3, NULL)
                ON CONFLICT (key_hash) DO NOTHING
                RETURNING l.epoch, l.expires_at INTO v_epoch, v_expires;
                IF FOUND THEN
                    v_outcome := 'granted';
                END IF;
            END IF;
            IF v_outcome IS NULL THEN
                -- The key exists and was held when the UPDATE looked. Read it
                -- again (a fresh snapshot): the same owner and live means
                -- idempotent success; another owner and live means denial;
                -- anything else changed under us: try again.
                SELECT l.owner, l.epoch, l.expires_at INTO v_row
                  FROM lease.leases AS l
                 WHERE l.key_hash = v_hash AND l.key = $1;
                IF FOUND AND v_row.owner IS NOT NULL AND v_row.expires_at > clock_timestamp() THEN
                    IF v_row.owner = $2 THEN
                        -- Idempotent success. Lock the row as a grant would,
                        -- so that inside the caller's transaction this acquire
                        -- also holds off a takeover until commit, and so that
                        -- lease rows are always locked before guard rows.
                        SELECT l.owner, l.epoch, l.expires_at INTO v_row
                          FROM lease.leases AS l
                         WHERE l.key_hash = v_hash AND l.key = $1
                           FOR NO KEY UPDATE;
                        IF v_row.owner = $2 AND v_row.expires_at > clock_timestamp() THEN
                            v_outcome := 'granted';
                            v_epoch := v_row.epoch;
                            v_expires := v_row.expires_at;
                        END IF;
                    ELSE
                        v_outcome := 'denied';
                    END IF;
                END IF;
            END IF;
            IF v_outcome IS DISTINCT FROM 'granted' THEN
                RAISE EXCEPTION USING ERRCODE = 'LH001';   -- roll the attempt back
            END IF;
        EXCEPTION WHEN SQLSTATE 'LH001' THEN
            NULL;   -- the attempt's locks are gone with it
        END;
        IF v_outcome = 'granted' THEN
            acquired := true;
            epoch := v_epoch;
            expires_at := v_expires;
            RETURN NEXT;
            RETURN;
        END IF;
        IF v_outcome IS NULL THEN
            CONTINUE attempt;   -- the state changed under us
        END IF;
        IF v_deadline IS NULL THEN
            acquired := false;
            epoch := NULL;
            expires_at := NULL;
            RETURN NEXT;
            RETURN;
        END IF;
        IF clock_timestamp() >= v_deadline THEN
            RAISE EXCEPTION 'lease wait timed out: key % stayed held by another owner for the whole wait of %', $1, $4
                USING ERRCODE = '57014',
                      CONSTRAINT = 'lease_wait_timeout',
                      DETAIL = format('key=%s wait=%s', $1, $4),
                      HINT = 'Retry later, wait longer, or inspect the key to see who holds it and until when.';
        END IF;
        -- Poll: the seed's 50 ms interval, never sleeping past the deadline.
        PERFORM pg_catalog.pg_sleep(LEAST(0.05,
            GREATEST(0, EXTRACT(epoch FROM v_deadline - clock_timestamp()))::double precision));
    END LOOP;
END;
$$;

CREATE FUNCTION lease.renew(key text, owner text, epoch bigint, ttl interval)
RETURNS TABLE (status text, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_hash bytea;
BEGIN
    IF $1 IS NULL OR $1 = '' OR $2 IS NULL OR $2 = '' OR $3 IS NULL
       OR $4 IS NULL OR $4 <= interval '0' OR $4 > interval '100 years' THEN
        PERFORM lease._raise_invalid('renew', lease._violations($1, true, $2, true, $4, false, NULL, true, $3));
    END IF;
    v_hash := pg_catalog.sha256(pg_catalog.convert_to($1, 'UTF8'));
    UPDATE lease.leases AS l
       SET expires_at = clock_timestamp() + $4
     WHERE l.key_hash = v_hash AND l.key = $1 AND l.owner = $2 AND l.epoch = $3
       AND l.expires_at > clock_timestamp()
    RETURNING l.expires_at INTO renew.expires_at;
    IF FOUND THEN
        status := 'ok';
        RETURN NEXT;
        RETURN;
    END IF;
    status := lease._status_locked(v_hash, $1, $2, $3);
    IF status = 'ok' THEN
        -- The row changed between the UPDATE and the lock (for example a
        -- concurrent same-owner acquire); it matches now and is locked.
        UPDATE lease.leases AS l
           SET expires_at = clock_timestamp() + $4
         WHERE l.key_hash = v_hash AND l.key = $1
        RETURNING l.expires_at INTO renew.expires_at;
    ELSE
        renew.expires_at := NULL;
    END IF;
    RETURN NEXT;
END;
$$;

CREATE FUNCTION lease.release(key text, owner text, epoch bigint)
RETURNS TABLE (status text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_hash bytea;
BEGIN
    IF $1 IS NULL OR $1 = '' OR $2 IS NULL OR $2 = '' OR $3 IS NULL THEN
        PERFORM lease._raise_invalid('release', lease._violations($1, true, $2, false, NULL, false, NULL, true, $3));
    END IF;
    v_hash := pg_catalog.sha256(pg_catalog.convert_to($1, 'UTF8'));
    UPDATE lease.leases AS l
       SET owner = NULL, expires_at = NULL, lapsed_owner = NULL, epoch = l.epoch + 1
     WHERE l.key_hash = v_hash AND l.key = $1 AND l.owner = $2 AND l.epoch = $3
       AND l.expires_at > clock_timestamp();
    IF FOUND THEN
        status := 'ok';
        RETURN NEXT;
        RETURN;
    END IF;
    status := lease._status_locked(v_hash, $1, $2, $3);
    IF status = 'ok' THEN
        UPDATE lease.leases AS l
           SET owner = NULL, expires_at = NULL, lapsed_owner = NULL, epoch = l.epoch + 1
         WHERE l.key_hash = v_hash AND l.key = $1;
    END IF;
    RETURN NEXT;
END;
$$;

CREATE FUNCTION lease.inspect(key text)
RETURNS TABLE (held boolean, owner text, epoch bigint, expires_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    IF $1 IS NULL OR $1 = '' THEN
        PERFORM lease._raise_invalid('inspect', lease._violations($1, false, NULL, false, NULL, false, NULL, false, NULL));
    END IF;
    RETURN QUERY
        SELECT l.owner IS NOT NULL AND l.expires_at > v_now,
               CASE WHEN l.owner IS NOT NULL AND l.expires_at > v_now THEN l.owner END,
               l.epoch,
               CASE WHEN l.owner IS NOT NULL AND l.expires_at > v_now THEN l.expires_at END
          FROM lease.leases AS l
         WHERE l.key_hash = pg_catalog.sha256(pg_catalog.convert_to($1, 'UTF8')) AND l.key = $1;
END;
$$;

-- Internal helpers are not part of the API.
REVOKE ALL ON FUNCTION lease._key_hash(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._violations(text, boolean, text, boolean, interval, boolean, interval, boolean, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._raise_invalid(text, text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._status_locked(bytea, text, text, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lease.acquire(text, text, interval, interval) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.renew(text, text, bigint, interval) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.release(text, text, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.inspect(text) TO PUBLIC;
