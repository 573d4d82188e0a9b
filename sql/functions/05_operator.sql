-- leasehold: operator actions (docs/SPECIFICATION.md §4): binding key
-- namespaces to roles, listing and removing those bindings, freeing a key
-- whatever its state, and raising the generation (§1.2, §1.7).
--
-- The rules of migration 000001_tables apply, with one difference: these functions
-- are granted to nobody. The role that installed leasehold owns them and may run them; it grants EXECUTE to the
-- roles that operate the deployment (docs/guide/security.md), e.g.
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

SET LOCAL lock_timeout = '5s';

-- The violations of a namespace prefix: not NULL, not empty, at most 1024
-- bytes (lease.namespaces.prefix is a btree key).
CREATE OR REPLACE FUNCTION lease._prefix_violations(prefix text)
RETURNS text[]
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE
        WHEN octet_length(prefix) > 1024 THEN ARRAY['prefix must be at most 1024 bytes']
        ELSE lease._text_violations('prefix', prefix)
    END
$$;

-- How lease.list_namespaces shows a rule that admits nobody but
-- superusers: `pg_dropped_role(<oid>)` when its role was dropped or
-- renamed in the cluster that recorded it, `pg_missing_role(<name>)` when
-- it came from another cluster and no role here has its name (creating
-- that role, or binding again, repairs it). PostgreSQL reserves role names
-- starting with `pg_` for its own roles, and none of those holds
-- parentheses, so neither text can be the name of a real role.
CREATE OR REPLACE FUNCTION lease._dropped_role_label(rule lease.namespaces)
RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN (rule).system_identifier = (pg_control_system()).system_identifier
                THEN 'pg_dropped_role(' || (rule).role_oid::text || ')'
                ELSE 'pg_missing_role(' || (rule).role_name || ')' END
$$;

-- Records that the namespace rules changed, in the changing transaction
-- (see lease.namespace_changes): a transaction whose snapshot is older
-- then fails its next namespace decision with 40001 instead of acting
-- under the old rules.
CREATE OR REPLACE FUNCTION lease._namespaces_changed()
RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE lease.namespace_changes AS c SET changed_at = clock_timestamp() WHERE c.singleton
$$;

-- Binds `prefix` to the existing role named `role` (its name as stored in
-- pg_roles, not an SQL identifier: no quotes, case matters). A prefix that
-- is bound already is rebound, and its created_at becomes now. From the
-- commit on, every key and resource name whose longest bound prefix is this
-- one may be used only by members of `role` (and superusers), whatever the
-- snapshot of the transaction that asks (lease._allowed_by_rules).
CREATE OR REPLACE FUNCTION lease.bind_namespace(prefix text, role text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_prefix text COLLATE "C" := prefix;
    v_role_name text COLLATE "C" := role;
    v_role oid;
BEGIN
    IF lease._name_ok(v_role_name) THEN
        SELECT r.oid INTO v_role FROM pg_catalog.pg_roles AS r WHERE r.rolname::text = v_role_name;
    END IF;
    IF NOT lease._name_ok(v_prefix) OR octet_length(v_prefix) > 1024 OR v_role IS NULL THEN
        PERFORM lease._raise_invalid('bind_namespace',
            lease._prefix_violations(v_prefix)
            || CASE
                   WHEN NOT lease._name_ok(v_role_name) THEN lease._text_violations('role', v_role_name)
                   WHEN v_role IS NULL THEN ARRAY[format('role must name an existing role (there is no role %L)', v_role_name)]
                   ELSE ARRAY[]::text[]
               END);
    END IF;
    PERFORM lease._namespaces_changed();
    INSERT INTO lease.namespaces AS n (prefix, role_oid, role_name, created_at, system_identifier)
    VALUES (v_prefix, v_role, v_role_name, clock_timestamp(), (pg_control_system()).system_identifier)
    ON CONFLICT ON CONSTRAINT namespaces_pkey DO UPDATE
       SET role_oid = excluded.role_oid,
           role_name = excluded.role_name,
           created_at = excluded.created_at,
           system_identifier = excluded.system_identifier;
    PERFORM lease._make_durable();
END;
$$;

-- Removes the rule for exactly `prefix`; answers whether there was one.
-- Names it governed fall to the next-longest bound prefix, or to no rule.
CREATE OR REPLACE FUNCTION lease.unbind_namespace(prefix text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_prefix text COLLATE "C" := prefix;
BEGIN
    IF NOT lease._name_ok(v_prefix) THEN
        PERFORM lease._raise_invalid('unbind_namespace', lease._text_violations('prefix', v_prefix));
    END IF;
    DELETE FROM lease.namespaces AS n WHERE n.prefix = v_prefix;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM lease._namespaces_changed();
    PERFORM lease._make_durable();
    RETURN true;
END;
$$;

-- Every rule, by prefix. `role` is the name of the role the rule admits
-- (lease._rule_role), or, for a rule that admits nobody but superusers,
-- lease._dropped_role_label: `pg_dropped_role(<oid>)` or
-- `pg_missing_role(<name>)`.
CREATE OR REPLACE FUNCTION lease.list_namespaces()
RETURNS TABLE (prefix text, role text, created_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT n.prefix,
           CASE WHEN lease._rule_role(n) <> 0 THEN n.role_name
                ELSE lease._dropped_role_label(n) END,
           n.created_at
      FROM lease.namespaces AS n
     ORDER BY n.prefix
$$;

-- Ends the grant of the row `key_hash`, which the caller has locked FOR NO
-- KEY UPDATE and found held or lapsed, as a release ends it (owner
-- cleared, counter + 1, the heartbeat group counts it out, waiters are
-- woken). Returns the counter after.
CREATE OR REPLACE FUNCTION lease._force_free(key_hash bytea, group_id bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_epoch bigint;
BEGIN
    UPDATE lease.leases AS l
       SET (key, key_hash, owner, epoch, expires_at, lapsed_owner, first_epoch, group_id, force_released) = ROW((lease._freed(l, true)).*)
     WHERE l.key_hash = _force_free.key_hash
    RETURNING l.epoch INTO v_epoch;
    IF _force_free.group_id IS NOT NULL THEN
        PERFORM lease._left_groups(ARRAY[_force_free.group_id]);
    END IF;
    PERFORM lease._on_release(_force_free.key_hash);
    PERFORM lease._make_durable();
    RETURN v_epoch;
END;
$$;

-- Frees `key` whatever its state: a held or lapsed grant ends as a release
-- would end it (owner cleared, counter + 1, so the grant's epoch and every
-- lower one are stale), and a waiter is notified as after a release.
-- Returns the counter after the call: every epoch at or below it is stale,
-- which is the `up_to` to fence resources with. A FREE key is left as it is
-- (its counter returned); a never-leased key has no counter: NULL, and
-- nothing is written. Locks the row as a release does (FOR NO KEY UPDATE,
-- until the caller's transaction ends): it waits for a renew, release or
-- grant of the key in progress, not for a holder's open lease-checked
-- transaction (FOR KEY SHARE). The operator bounds the wait with its own
-- lock_timeout if it wants one.
CREATE OR REPLACE FUNCTION lease.force_release(key text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key text COLLATE "C" := key;
    v_hash bytea;
    v_row record;
BEGIN
    IF NOT lease._name_ok(v_key) THEN
        PERFORM lease._raise_invalid('force_release', lease._text_violations('key', v_key));
    END IF;
    v_hash := lease._key_hash(v_key);
    SELECT l.owner, l.epoch, l.group_id INTO v_row
      FROM lease.leases AS l
     WHERE l.key_hash = v_hash AND l.key = v_key
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF v_row.owner IS NULL THEN
        RETURN v_row.epoch;
    END IF;
    RETURN lease._force_free(v_hash, v_row.group_id);
END;
$$;

-- Ends exactly the grant (key, epoch), whoever holds it, and never a newer
-- one: the operator's answer to "that holder is stuck", given the epoch it
-- saw (`leasehold ls`, lease.inspect). The one-argument form frees whatever
-- grant the key has when the call runs, which may be a grant made after the
-- operator looked; this form cannot be. A held or lapsed grant at exactly
-- `epoch` ends as a release ends it. Otherwise nothing is written, and the
-- status says why:
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
-- Locks the row FOR NO KEY UPDATE, and decides on its newest version.
CREATE OR REPLACE FUNCTION lease.force_release(key text, epoch bigint)
RETURNS TABLE (status text, counter bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key text COLLATE "C" := key;
    v_epoch bigint := epoch;
    v_hash bytea;
    v_row record;
BEGIN
    IF NOT (lease._name_ok(v_key) AND v_epoch IS NOT NULL AND v_epoch >= 1) THEN
        PERFORM lease._raise_invalid('force_release',
            lease._text_violations('key', v_key) || lease._epoch_violations('epoch', v_epoch, 1));
    END IF;
    v_hash := lease._key_hash(v_key);
    SELECT l.owner, l.epoch, l.group_id INTO v_row
      FROM lease.leases AS l
     WHERE l.key_hash = v_hash AND l.key = v_key
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        status := 'no_such_grant';
        counter := NULL;
    ELSIF v_row.owner IS NOT NULL AND v_row.epoch = v_epoch THEN
        status := 'released';
        counter := lease._force_free(v_hash, v_row.group_id);
    ELSIF v_row.owner IS NOT NULL AND v_row.epoch > v_epoch THEN
        status := 'newer_grant';
        counter := v_row.epoch;
    ELSIF v_row.owner IS NULL AND v_row.epoch >= v_epoch THEN
        status := 'already_free';
        counter := v_row.epoch;
    ELSE
        status := 'no_such_grant';
        counter := v_row.epoch;
    END IF;
    RETURN NEXT;
END;
$$;

-- Raises the generation (docs/SPECIFICATION.md §1.2, §1.7) to
-- `generation`: from the commit on, every grant's epoch is at least
-- (generation << 40) + 1, for every key. For what timelines cannot see: a
-- failover the HA manager did by other means than promotion, or an
-- operator who wants a margin after a split brain was resolved. Returns the
-- new generation.
--
-- Only ever raises: a value at or below the current generation is refused
-- with SQLSTATE 22023, constraint lease_generation_not_above, and DETAIL
-- `current=<generation> requested=<generation>`; one above 2^23 - 1, or
-- NULL, is invalid input (lease_invalid_input). Nothing changes then. The
-- row stays locked until the caller's transaction ends, so two raises are
-- serialised; a grant meanwhile is not held up (it does not lock the row on
-- its common path).
CREATE OR REPLACE FUNCTION lease.raise_generation(generation bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_generation bigint := generation;
    v_current bigint;
BEGIN
    IF v_generation IS NULL OR v_generation > lease._max_generation() THEN
        PERFORM lease._raise_invalid('raise_generation',
            CASE WHEN v_generation IS NULL THEN ARRAY['generation must not be NULL']
                 ELSE ARRAY[format('generation must be at most %s', lease._max_generation())]
            END);
    END IF;
    PERFORM 1 FROM lease.lineage AS g WHERE g.singleton FOR NO KEY UPDATE;
    v_current := lease._generation(true);
    IF v_generation <= v_current THEN
        RAISE EXCEPTION 'invalid input to lease.raise_generation: generation must be above the current generation %', v_current
            USING ERRCODE = '22023',
                  CONSTRAINT = 'lease_generation_not_above',
                  DETAIL = format('current=%s requested=%s', v_current, v_generation),
                  HINT = 'A generation is only ever raised: pass a value above the current generation (lease.generation()).';
    END IF;
    UPDATE lease.lineage AS g
       SET external_floor = v_generation
     WHERE g.singleton;
    PERFORM lease._make_durable();
    RETURN v_generation;
END;
$$;

REVOKE ALL ON FUNCTION lease._prefix_violations(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._dropped_role_label(lease.namespaces) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._namespaces_changed() FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._force_free(bytea, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease.bind_namespace(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease.unbind_namespace(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease.list_namespaces() FROM PUBLIC;
REVOKE ALL ON FUNCTION lease.force_release(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease.force_release(text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease.raise_generation(bigint) FROM PUBLIC;

-- Every file of functions and every migration ends so (see
-- lease._drop_default_grants).
SELECT lease._drop_default_grants();
