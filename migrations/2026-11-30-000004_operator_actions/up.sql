-- leasehold: operator actions (docs/SPECIFICATION.md §4): binding key
-- namespaces to roles, listing and removing those bindings, freeing a key
-- whatever its state, and raising the generation (§1.2, §1.7).
--
-- The rules of 2026-11-30-000001 apply (security, names, hot paths first),
-- with one difference: these functions are granted to nobody. The role that
-- installed leasehold owns them and may run them; it grants EXECUTE to the
-- roles that operate the deployment (README.md, "Security model"), e.g.
--
--   GRANT EXECUTE ON FUNCTION lease.force_release(text), lease.force_release(text, bigint),
--         lease.bind_namespace(text, text),
--         lease.unbind_namespace(text), lease.list_namespaces(),
--         lease.raise_generation(bigint) TO ops;
--
-- Operator actions do not obey namespace rules: an operator acts on every
-- name. Why: the rules say which application roles may use which keys; the
-- operator is the one who writes those rules, and must be able to repair any
-- key (a forced release of a key bound to a role that was dropped, say)
-- without first joining the role that owns it. What limits an operator is
-- the explicit GRANT, nothing else.
--
-- Every function that writes raises synchronous_commit from off or local to
-- on for its own transaction (docs/SPECIFICATION.md §1.4), as the lease
-- functions do: a namespace rule or a forced release that was acknowledged
-- survives a crash whatever the caller's session set.

-- The violations of a namespace prefix: not NULL, not empty, at most 1024
-- bytes (lease.namespaces.prefix is a btree key).
CREATE FUNCTION lease._prefix_violations(prefix text)
RETURNS text[]
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE
        WHEN octet_length(prefix) > 1024 THEN ARRAY['prefix must be at most 1024 bytes']
        ELSE lease._text_violations('prefix', prefix)
    END
$$;

-- How lease.list_namespaces shows a rule whose role was dropped. PostgreSQL
-- reserves role names starting with `pg_` for its own roles (CREATE ROLE and
-- ALTER ROLE ... RENAME refuse them), and none of those holds parentheses,
-- so this text can never be the name of a real role.
CREATE FUNCTION lease._dropped_role_label(role_oid oid)
RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT 'pg_dropped_role(' || role_oid::text || ')'
$$;

-- Binds `prefix` to the existing role named `role` (its name as stored in
-- pg_roles, not an SQL identifier: no quotes, case matters). A prefix that
-- is bound already is rebound, and its created_at becomes now. From the
-- commit on, every key and resource name whose longest bound prefix is this
-- one may be used only by members of `role` (and superusers).
CREATE FUNCTION lease.bind_namespace(prefix text, role text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_role oid;
BEGIN
    IF role IS NOT NULL AND role <> '' THEN
        SELECT r.oid INTO v_role FROM pg_catalog.pg_roles AS r WHERE r.rolname = bind_namespace.role;
    END IF;
    IF prefix IS NULL OR prefix = '' OR octet_length(prefix) > 1024 OR v_role IS NULL THEN
        PERFORM lease._raise_invalid('bind_namespace',
            lease._prefix_violations(prefix)
            || CASE
                   WHEN role IS NULL OR role = '' THEN lease._text_violations('role', role)
                   WHEN v_role IS NULL THEN ARRAY[format('role must name an existing role (there is no role %L)', role)]
                   ELSE ARRAY[]::text[]
               END);
    END IF;
    INSERT INTO lease.namespaces AS n (prefix, role_oid, created_at)
    VALUES (bind_namespace.prefix, v_role, clock_timestamp())
    ON CONFLICT ON CONSTRAINT namespaces_pkey DO UPDATE
       SET role_oid = excluded.role_oid,
           created_at = excluded.created_at;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
END;
$$;

-- Removes the rule for exactly `prefix`; answers whether there was one.
-- Names it governed fall to the next-longest bound prefix, or to no rule.
CREATE FUNCTION lease.unbind_namespace(prefix text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF prefix IS NULL OR prefix = '' THEN
        PERFORM lease._raise_invalid('unbind_namespace', lease._text_violations('prefix', prefix));
    END IF;
    DELETE FROM lease.namespaces AS n WHERE n.prefix = unbind_namespace.prefix;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    RETURN true;
END;
$$;

-- Every rule, by prefix. `role` is the bound role's name, or, for a role
-- that was dropped (its rule admits nobody but superusers),
-- lease._dropped_role_label(oid): `pg_dropped_role(<oid>)`.
CREATE FUNCTION lease.list_namespaces()
RETURNS TABLE (prefix text, role text, created_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT n.prefix,
           COALESCE(r.rolname::text, lease._dropped_role_label(n.role_oid)),
           n.created_at
      FROM lease.namespaces AS n
      LEFT JOIN pg_catalog.pg_roles AS r ON r.oid = n.role_oid
     ORDER BY n.prefix COLLATE "C"
$$;

-- Frees `key` whatever its state: a held or lapsed grant ends as a release
-- would end it (owner cleared, counter + 1, so the grant's epoch and every
-- lower one are stale), and a waiter is notified as after a release
-- (lease._on_release, 2026-11-30-000003). Returns the counter after
-- the call: every epoch at or below it is stale, which is the `up_to` to
-- fence resources with. A FREE key is left as it is (its counter returned);
-- a never-leased key has no counter: NULL, and nothing is written. Locks the
-- row as a release does (FOR NO KEY UPDATE, until the caller's transaction
-- ends): it waits for a renew, release or grant of the key in progress, not
-- for a holder's open lease-checked transaction (FOR KEY SHARE). Such a
-- transaction may still commit its write after the forced release, as after
-- the holder's own release, but no new grant commits before it ends (G6).
-- The operator bounds the wait with its own lock_timeout if it wants one.
CREATE FUNCTION lease.force_release(key text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_hash bytea;
    v_epoch bigint;
    v_group bigint;
BEGIN
    IF key IS NULL OR key = '' THEN
        PERFORM lease._raise_invalid('force_release', lease._text_violations('key', key));
    END IF;
    v_hash := lease._key_hash(key);
    -- Locked first to learn the grant's heartbeat group, which the release
    -- counts it out of (lease.groups.members).
    SELECT l.group_id INTO v_group
      FROM lease.leases AS l
     WHERE l.key_hash = v_hash AND l.key = force_release.key AND l.owner IS NOT NULL
       FOR NO KEY UPDATE;
    IF FOUND THEN
        UPDATE lease.leases AS l
           SET owner = NULL, expires_at = NULL, lapsed_owner = NULL, epoch = l.epoch + 1, group_id = NULL
         WHERE l.key_hash = v_hash AND l.key = force_release.key
        RETURNING l.epoch INTO v_epoch;
        PERFORM lease._left_groups(ARRAY[v_group]);
        PERFORM lease._on_release(v_hash);
        IF current_setting('synchronous_commit') IN ('off', 'local') THEN
            PERFORM set_config('synchronous_commit', 'on', true);
        END IF;
        RETURN v_epoch;
    END IF;
    SELECT l.epoch INTO v_epoch
      FROM lease.leases AS l
     WHERE l.key_hash = v_hash AND l.key = force_release.key;
    RETURN v_epoch;
END;
$$;

-- Ends exactly the grant (key, epoch), whoever holds it, and never a newer
-- one: the operator's answer to "that holder is stuck", given the epoch it
-- saw (`leasehold ls`, lease.inspect). The one-argument form above frees
-- whatever grant the key has when the call runs, which may be a grant made
-- after the operator looked; this form cannot be. A held or lapsed grant at
-- exactly `epoch` ends as a release ends it (owner cleared, counter + 1,
-- waiters notified as after a release, lease._on_release of
-- 2026-11-30-000003). Otherwise
-- nothing is written, and the status says why:
--
--   released       the grant ended; counter = epoch + 1
--   newer_grant    the key is held (or lapsed) under a higher epoch: grant
--                  `epoch` ended already and someone holds the key since;
--                  counter = that grant's epoch
--   already_free   the key is FREE and its counter is at or above `epoch`:
--                  grant `epoch`, if there was one, has ended
--   no_such_grant  the key was never leased (counter NULL), or `epoch` is
--                  above every epoch it was granted
--
-- A NULL, empty or over-long key, or an epoch that is NULL or below 1, is
-- invalid input (SQLSTATE 22023, lease_invalid_input) and changes nothing.
-- Locks as the one-argument form does. Granted to nobody, like it.
CREATE FUNCTION lease.force_release(key text, epoch bigint)
RETURNS TABLE (status text, counter bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_hash bytea;
    v_owner text;
    v_epoch bigint;
    v_group bigint;
BEGIN
    IF key IS NULL OR key = '' OR octet_length(key) > 16384 OR epoch IS NULL OR epoch < 1 THEN
        PERFORM lease._raise_invalid('force_release',
            lease._text_violations('key', key) || lease._epoch_violations('epoch', epoch, 1));
    END IF;
    v_hash := lease._key_hash(key);
    -- A second pass only when a grant at `epoch` committed between the
    -- UPDATE's snapshot and the status read (as lease.release does).
    FOR v_pass IN 1..100 LOOP
        SELECT l.group_id INTO v_group
          FROM lease.leases AS l
         WHERE l.key_hash = v_hash AND l.key = force_release.key
           AND l.owner IS NOT NULL AND l.epoch = force_release.epoch
           FOR NO KEY UPDATE;
        IF FOUND THEN
            UPDATE lease.leases AS l
               SET owner = NULL, expires_at = NULL, lapsed_owner = NULL, epoch = l.epoch + 1, group_id = NULL
             WHERE l.key_hash = v_hash AND l.key = force_release.key
            RETURNING l.epoch INTO v_epoch;
            PERFORM lease._left_groups(ARRAY[v_group]);
            PERFORM lease._on_release(v_hash);
            IF current_setting('synchronous_commit') IN ('off', 'local') THEN
                PERFORM set_config('synchronous_commit', 'on', true);
            END IF;
            status := 'released';
            counter := v_epoch;
            RETURN NEXT;
            RETURN;
        END IF;
        SELECT l.owner, l.epoch INTO v_owner, v_epoch
          FROM lease.leases AS l
         WHERE l.key_hash = v_hash AND l.key = force_release.key;
        counter := v_epoch;
        IF NOT FOUND THEN
            status := 'no_such_grant';
        ELSIF v_owner IS NOT NULL AND v_epoch > force_release.epoch THEN
            status := 'newer_grant';
        ELSIF v_owner IS NULL AND v_epoch >= force_release.epoch THEN
            status := 'already_free';
        ELSIF v_owner IS NOT NULL AND v_epoch = force_release.epoch THEN
            CONTINUE;
        ELSE
            status := 'no_such_grant';
        END IF;
        RETURN NEXT;
        RETURN;
    END LOOP;
    RAISE EXCEPTION 'lease.force_release could not settle the state of key %', key
        USING ERRCODE = '40001', CONSTRAINT = 'lease_contention', HINT = 'Retry the call.';
END;
$$;

-- Raises the generation (docs/SPECIFICATION.md §1.2, §1.7) to
-- `generation`: from the commit on, every grant's epoch is at least
-- (generation << 40) + 1, for every key. For what timelines cannot see: a
-- failover the HA manager did by other means than promotion (a server
-- restored from a file-system snapshot onto the same timeline), or an
-- operator who wants a margin after a split brain was resolved. Returns the
-- new generation.
--
-- Only ever raises: a value at or below the current generation is refused
-- with SQLSTATE 22023, constraint lease_generation_not_above, and DETAIL
-- `current=<generation> requested=<generation>`; one above 2^23 - 1 (epochs
-- must stay positive bigints), or NULL, is invalid input
-- (lease_invalid_input). Nothing changes then. The row stays locked
-- until the caller's transaction ends, so two raises are serialised; a grant
-- meanwhile is not held up (it does not lock the row on its common path).
CREATE FUNCTION lease.raise_generation(generation bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_current bigint;
BEGIN
    IF generation IS NULL OR generation > lease._max_generation() THEN
        PERFORM lease._raise_invalid('raise_generation',
            CASE WHEN generation IS NULL THEN ARRAY['generation must not be NULL']
                 ELSE ARRAY[format('generation must be at most %s', lease._max_generation())]
            END);
    END IF;
    PERFORM 1 FROM lease.lineage AS g WHERE g.singleton FOR NO KEY UPDATE;
    v_current := lease._generation(true, true);
    IF raise_generation.generation <= v_current THEN
        RAISE EXCEPTION 'invalid input to lease.raise_generation: generation must be above the current generation %', v_current
            USING ERRCODE = '22023',
                  CONSTRAINT = 'lease_generation_not_above',
                  DETAIL = format('current=%s requested=%s', v_current, raise_generation.generation),
                  HINT = 'A generation is only ever raised: pass a value above the current generation (lease.generation()).';
    END IF;
    UPDATE lease.lineage AS g
       SET external_floor = raise_generation.generation
     WHERE g.singleton;
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    RETURN raise_generation.generation;
END;
$$;

REVOKE ALL ON FUNCTION lease._prefix_violations(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._dropped_role_label(oid) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease.bind_namespace(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease.unbind_namespace(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease.list_namespaces() FROM PUBLIC;
REVOKE ALL ON FUNCTION lease.force_release(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease.force_release(text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease.raise_generation(bigint) FROM PUBLIC;
