-- leasehold: operator actions (docs/SPECIFICATION.md §4): binding key
-- namespaces to roles, listing and removing those bindings, freeing a key
-- whatever its state, raising the generation (§1.2, §1.7), and listing
-- keys.
--
-- The rules of migration 000001_tables apply, with one difference: these functions
-- are granted to nobody (but the listing of keys, lease.list_leases, which
-- admits whoever may read the tables it lists). The role that installed leasehold owns them and may run them; it grants EXECUTE to the
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
    PERFORM lease._on_change(_force_free.key_hash, 'lease_released');
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

-- The operator's listing (`leasehold ls`, Operator::list_leases): every key
-- starting with `prefix` (byte-wise), of `holder` when given (a held or
-- lapsed grant's owner; a FREE key has none), in `states` ('held',
-- 'lapsed', 'free'; empty for all), ordered by `sort` ('key'; 'expires':
-- soonest effective expiry first, FREE keys last; 'epoch': highest first;
-- ties by key in byte order), at most `max_rows` rows. The state is
-- lease._live's and the expiry lease._expiry's, so the listing shows what
-- every call decides. `read_at` is the clock read before the rows: a held
-- row's expiry is after it. No key matched: one row with only `read_at`.
--
-- Who may list: a role that may read lease.leases and lease.groups itself
-- (their owner, a superuser, a role granted SELECT on both), asked of
-- session_user as every namespace decision is, and never of a backend that
-- runs code its login role never sent (lease._borrowed_session). So EXECUTE is PUBLIC's, and
-- the function shows nobody a key the tables would not show them; anybody
-- else is refused (42501) before a row is read. The Rust client asks first
-- whether its role may read both tables (LeaseError::ListNotPermitted), so
-- a refusal does not abort the caller's transaction.
CREATE OR REPLACE FUNCTION lease.list_leases(prefix text, holder text, states text[], sort text, max_rows bigint)
RETURNS TABLE (read_at timestamptz, key text, digest text, state text, owner text, epoch bigint,
               expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_prefix text COLLATE "C" := prefix;
    v_holder text COLLATE "C" := holder;
    v_states text[] := states;
    v_sort text := sort;
    v_max bigint := max_rows;
    v_now timestamptz;
BEGIN
    IF NOT (has_table_privilege(session_user, 'lease.leases', 'SELECT')
            AND has_table_privilege(session_user, 'lease.groups', 'SELECT'))
       OR lease._borrowed_session() THEN
        RAISE EXCEPTION 'permission denied for lease.list_leases: role % may not read lease.leases and lease.groups', session_user
            USING ERRCODE = '42501',
                  HINT = 'Connect as the role that installed leasehold, or have it GRANT SELECT ON lease.leases, lease.groups to this role.';
    END IF;
    IF v_prefix IS NULL OR v_holder = '' OR v_states IS NULL OR array_position(v_states, NULL) IS NOT NULL
       OR NOT (v_states <@ ARRAY['held', 'lapsed', 'free']) OR v_sort IS NULL
       OR v_sort NOT IN ('key', 'expires', 'epoch') OR v_max IS NULL OR v_max < 1 THEN
        PERFORM lease._raise_invalid('list_leases',
            CASE WHEN v_prefix IS NULL THEN ARRAY['prefix must not be NULL'] ELSE ARRAY[]::text[] END
            || CASE WHEN v_holder = '' THEN ARRAY['owner must not be empty'] ELSE ARRAY[]::text[] END
            || CASE WHEN v_states IS NULL OR array_position(v_states, NULL) IS NOT NULL
                         OR NOT (v_states <@ ARRAY['held', 'lapsed', 'free'])
                    THEN ARRAY['states must each be held, lapsed or free'] ELSE ARRAY[]::text[] END
            || CASE WHEN v_sort IS NULL OR v_sort NOT IN ('key', 'expires', 'epoch')
                    THEN ARRAY['sort must be key, expires or epoch'] ELSE ARRAY[]::text[] END
            || CASE WHEN v_max IS NULL OR v_max < 1 THEN ARRAY['max_rows must be at least 1'] ELSE ARRAY[]::text[] END);
    END IF;
    v_now := clock_timestamp();
    RETURN QUERY
        WITH listed AS (
            SELECT l.key::text AS key,
                   encode(l.key_hash, 'hex') AS digest,
                   CASE WHEN l.owner IS NULL THEN 'free'
                        WHEN lease._live(l) THEN 'held'
                        ELSE 'lapsed' END AS state,
                   l.owner::text AS owner,
                   l.epoch::bigint AS epoch,
                   lease._expiry(l) AS expires_at
              FROM lease.leases AS l
             WHERE left(l.key, length(v_prefix)) = v_prefix
               AND (v_holder IS NULL OR l.owner = v_holder)),
        ranked AS (
            SELECT s.*,
                   row_number() OVER (ORDER BY CASE WHEN v_sort = 'expires' THEN s.expires_at END ASC NULLS LAST,
                                               CASE WHEN v_sort = 'epoch' THEN s.epoch END DESC,
                                               s.key COLLATE "C") AS ordinal
              FROM listed AS s
             WHERE cardinality(v_states) = 0 OR s.state = ANY (v_states))
        SELECT v_now, r.key, r.digest, r.state, r.owner, r.epoch, r.expires_at
          FROM (SELECT 1) AS c
          LEFT JOIN ranked AS r ON r.ordinal <= v_max
         ORDER BY r.ordinal;
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
-- {"current": <generation>, "requested": <generation>}; one above 2^23 - 1, or
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
                  DETAIL = lease._detail('current', v_current::text, 'requested', v_generation::text),
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
-- Its own gate decides who may list (above).
GRANT EXECUTE ON FUNCTION lease.list_leases(text, text, text[], text, bigint) TO PUBLIC;

-- Every file of functions and every migration ends so (see
-- lease._drop_default_grants).
SELECT lease._drop_default_grants();
