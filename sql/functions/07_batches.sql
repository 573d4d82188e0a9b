-- leasehold: many keys, one heartbeat (docs/SPECIFICATION.md §1.3,
-- `lease.renew_many` and `lease.release_many`).
--
-- A worker that holds hundreds of keys (partitions, shards, tenants) would
-- otherwise send one renew per key per heartbeat. These functions renew or
-- release a set of one owner's grants in one call: the same statuses, in
-- the same precedence, as lease.renew and lease.release give key by key, at
-- the cost of one statement instead of one round trip, one function call and
-- one commit per key.
--
-- They follow the rules of 000001_tables and the per-key guarantees:
--
-- * Input first. Any violation (NULL arrays or elements, arrays of different
--   lengths or of more than one dimension, more keys than the cap,
--   duplicate keys, each key's own rules, digests that are not the keys')
--   raises 22023 `lease_invalid_input` naming every violation; nothing
--   changes. The per-key rules are checked only when they can matter (see
--   lease._check_many_keys); a violation found after keys were written
--   undoes the call's writes with the error.
-- * Digests from the caller. `key_hashes`, optional, carries each key's
--   SHA-256 so the server need not compute one per key (about a quarter
--   of a 1,000-key heartbeat, docs/PERFORMANCE.md). A digest only finds a
--   row whose key is also compared, so a wrong one can only miss.
-- * Namespaces, all or nothing. Every key is checked (§4.2) before anything
--   is written; the first forbidden key, in input order, is named in the
--   42501 `lease_namespace_denied` error, and nothing changes.
-- * Refusals lock nothing: the UPDATE locks a key's row only when its grant
--   matches (owner, epoch, live), exactly the rows that it writes.
-- * Lock order. A call locks the matching rows in key_hash order, whatever
--   the order of the input (lease._many_write), so two batch calls over
--   overlapping keys queue on their first common key instead of
--   deadlocking (tested in tests/leasehold/many_keys.rs).
-- * Durability (§1.4): a call that applied to at least one key raises
--   synchronous_commit to on for its transaction, as lease.renew does.
--
-- The cap of lease._max_batch() keys per call (lease._many_shape_ok) bounds what one
-- statement holds: its row locks last until the caller's transaction ends,
-- and a call can carry up to 16 KiB per key, so a cap keeps one call's
-- locks and message size (at most about 16 MiB) bounded. A worker with
-- more keys splits them over several calls.

SET LOCAL lock_timeout = '5s';

-- The hot path's shape check: both arrays present, one-dimensional (or
-- empty), of one length, at most the cap, without NULL elements, and the
-- optional digests (NULL, or one per key without NULL elements). Nested
-- CASE, not AND: array_position refuses a multi-dimensional array, so the
-- dimension check must come first, and AND does not promise an order.
CREATE OR REPLACE FUNCTION lease._many_shape_ok(keys text[], epochs bigint[], key_hashes bytea[])
RETURNS boolean
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE
        WHEN keys IS NULL OR epochs IS NULL THEN false
        WHEN COALESCE(array_ndims(keys), 1) <> 1 OR COALESCE(array_ndims(epochs), 1) <> 1
             OR COALESCE(array_ndims(key_hashes), 1) <> 1 THEN false
        WHEN cardinality(keys) <> cardinality(epochs) OR cardinality(keys) > lease._max_batch() THEN false
        WHEN key_hashes IS NOT NULL
             AND (cardinality(key_hashes) <> cardinality(keys)
                  OR array_position(key_hashes, NULL) IS NOT NULL) THEN false
        ELSE array_position(keys, NULL) IS NULL AND array_position(epochs, NULL) IS NULL
    END
$$;

-- Every violated rule of a batch's keys and epochs (the error path only),
-- in the terms of lease._raise_invalid. A key's own rules (not empty, at
-- most 16384 bytes) are named once for the batch, not once per key.
CREATE OR REPLACE FUNCTION lease._many_violations(keys text[], epochs bigint[], key_hashes bytea[])
RETURNS text[]
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_found text[] := ARRAY[]::text[];
    v_flat_keys boolean := keys IS NOT NULL AND COALESCE(array_ndims(keys), 1) = 1;
    v_flat_epochs boolean := epochs IS NOT NULL AND COALESCE(array_ndims(epochs), 1) = 1;
    v_flat_hashes boolean := key_hashes IS NOT NULL AND COALESCE(array_ndims(key_hashes), 1) = 1;
BEGIN
    IF keys IS NULL THEN
        v_found := v_found || 'keys must not be NULL'::text;
    ELSIF NOT v_flat_keys THEN
        v_found := v_found || 'keys must be a one-dimensional array'::text;
    END IF;
    IF epochs IS NULL THEN
        v_found := v_found || 'epochs must not be NULL'::text;
    ELSIF NOT v_flat_epochs THEN
        v_found := v_found || 'epochs must be a one-dimensional array'::text;
    END IF;
    IF keys IS NOT NULL AND epochs IS NOT NULL AND cardinality(keys) <> cardinality(epochs) THEN
        v_found := v_found || 'keys and epochs must have the same length'::text;
    END IF;
    IF cardinality(keys) > lease._max_batch() THEN
        v_found := v_found || format('keys must hold at most %s keys', lease._max_batch());
    END IF;
    IF v_flat_keys THEN
        IF array_position(keys, NULL) IS NOT NULL THEN
            v_found := v_found || 'keys must not contain NULL'::text;
        END IF;
        IF EXISTS (SELECT 1 FROM unnest(keys) AS k(key) WHERE octet_length(k.key) = 0) THEN
            v_found := v_found || 'keys must not contain an empty key'::text;
        END IF;
        IF EXISTS (SELECT 1 FROM unnest(keys) AS k(key) WHERE octet_length(k.key) > lease._max_name_bytes()) THEN
            v_found := v_found || format('keys must not contain a key over %s bytes', lease._max_name_bytes());
        END IF;
        IF EXISTS (SELECT 1 FROM unnest(keys) AS k(key) WHERE k.key IS NOT NULL
                    GROUP BY k.key COLLATE "C" HAVING count(*) > 1) THEN
            v_found := v_found || 'keys must not contain a key twice'::text;
        END IF;
    END IF;
    IF v_flat_epochs AND array_position(epochs, NULL) IS NOT NULL THEN
        v_found := v_found || 'epochs must not contain NULL'::text;
    END IF;
    IF key_hashes IS NOT NULL AND NOT v_flat_hashes THEN
        v_found := v_found || 'key_hashes must be a one-dimensional array'::text;
    END IF;
    IF v_flat_hashes THEN
        IF keys IS NOT NULL AND cardinality(key_hashes) <> cardinality(keys) THEN
            v_found := v_found || 'key_hashes must have the same length as keys'::text;
        END IF;
        IF array_position(key_hashes, NULL) IS NOT NULL THEN
            v_found := v_found || 'key_hashes must not contain NULL'::text;
        ELSIF v_flat_keys AND cardinality(key_hashes) = cardinality(keys)
              AND EXISTS (SELECT 1 FROM unnest(keys, key_hashes) AS k(key, key_hash)
                           WHERE k.key IS NOT NULL
                             AND k.key_hash <> lease._key_hash(k.key)) THEN
            v_found := v_found || 'key_hashes must hold the SHA-256 digest of each key'::text;
        END IF;
    END IF;
    RETURN v_found;
END;
$$;

-- The per-key input rules of a batch (no empty or over-long key, no key
-- twice, each digest the SHA-256 of its key's UTF-8 bytes), as
-- lease._many_violations states them; raises when one is broken. They cost
-- O(n) (a sort of the keys, a digest per key), and a call whose every key
-- matched a stored grant needs none of them: stored keys obey the key
-- rules, a key given twice matches its row once, and a wrong digest
-- matches no row. So the batch functions run them only before a namespace
-- check (bad input is reported before a refusal, as everywhere) and when
-- some key did not match; raising then undoes whatever the call had
-- written (the whole call fails).
CREATE OR REPLACE FUNCTION lease._check_many_keys(fn text, keys text[], epochs bigint[], key_hashes bytea[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_violations text[] := lease._many_violations(keys, epochs, key_hashes);
BEGIN
    IF cardinality(v_violations) > 0 THEN
        PERFORM lease._raise_invalid(fn, v_violations);
    END IF;
END;
$$;

-- Refuses the whole call when the caller may not act on one of its keys
-- (docs/SPECIFICATION.md §4.2), naming the first such key in input order:
-- lease._allowed, the one namespace decision, per key. The batch functions
-- call it only while some rule exists (lease._any_rules).
CREATE OR REPLACE FUNCTION lease._raise_forbidden_many(caller text, keys text[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key text;
BEGIN
    SELECT k.key INTO v_key
      FROM unnest(_raise_forbidden_many.keys) WITH ORDINALITY AS k(key, ord)
     WHERE NOT lease._allowed(k.key)
     ORDER BY k.ord
     LIMIT 1;
    IF FOUND THEN
        PERFORM lease._raise_forbidden(caller, 'key', v_key);
    END IF;
END;
$$;

-- A batch's keys still to answer (ordinals in `todo`, NULL: all) with
-- their epochs, ordinals and digests (the caller's, or computed), sorted
-- by digest: the order in which lease._many_write locks their rows.
-- Inlined into the statement that reads it.
CREATE OR REPLACE FUNCTION lease._many_input(keys text[], epochs bigint[], key_hashes bytea[], todo bigint[])
RETURNS TABLE (key text, epoch bigint, ord bigint, key_hash bytea)
LANGUAGE sql STABLE
AS $$
    SELECT i.key, i.epoch, i.ord, COALESCE(i.given_hash, lease._key_hash(i.key))
      FROM ROWS FROM (pg_catalog.unnest(keys), pg_catalog.unnest(epochs), pg_catalog.unnest(key_hashes))
           WITH ORDINALITY AS i(key, epoch, given_hash, ord)
     WHERE todo IS NULL OR i.ord OPERATOR(pg_catalog.=) ANY (todo)
     ORDER BY 4
$$;

-- One pass of a batch call: renews the grants among lease._many_input
-- that match (keys[i], owner, epochs[i], live) to now + `ttl` (op
-- 'renew_many') or releases them (op 'release_many': each leaves its
-- heartbeat group and wakes its waiters, as lease.release does). Answers
-- the ordinals written and, for a renew, their new expiries, in ordinal
-- order.
--
-- Lock order: rows are locked in key_hash order, whatever the order of
-- the input, so two batch calls over overlapping keys queue on their first
-- common key instead of deadlocking. A release locks its rows first,
-- ORDER BY key_hash FOR NO KEY UPDATE, which locks them as the sort hands
-- them on (and reads the group each leaves from its newest version). A
-- renew writes in one UPDATE driven by its sorted keys (a lock first would
-- write each row twice: 28 % more for a renew_many), which no plan can turn
-- into the table's order once sequential scans are off and index scans
-- on, whatever the caller disabled: the table is then read through its
-- key_hash index, in a nested loop or in index order. (PostgreSQL 18
-- counts disabled plan nodes, so a caller's enable_indexscan = off would
-- otherwise tie an index scan with a sequential one.)
-- tests/leasehold/many_keys.rs pins both against a caller's planner
-- settings.
CREATE OR REPLACE FUNCTION lease._many_write(op text, keys text[], owner text, epochs bigint[], ttl interval,
                                  key_hashes bytea[], todo bigint[],
                                  OUT ords bigint[], OUT expires timestamptz[])
RETURNS record
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_indexscan = on
AS $$
DECLARE
    v_hashes bytea[];
    v_groups bigint[];
    v_hash bytea;
BEGIN
    IF op = 'renew_many' THEN
        WITH renewed AS (
            UPDATE lease.leases AS l
               SET expires_at = lease._expires_in(_many_write.ttl)
              FROM lease._many_input(keys, epochs, key_hashes, todo) AS i
             WHERE l.key_hash = i.key_hash AND l.key = i.key COLLATE "C" AND l.owner = _many_write.owner COLLATE "C"
               AND l.epoch = i.epoch AND lease._live(l)
            RETURNING i.ord, l.expires_at
        )
        SELECT array_agg(r.ord ORDER BY r.ord), array_agg(r.expires_at ORDER BY r.ord) INTO ords, expires
          FROM renewed AS r;
        RETURN;
    END IF;
    WITH released AS (
        UPDATE lease.leases AS l
           SET (key, key_hash, owner, epoch, expires_at, lapsed_owner, first_epoch, group_id, force_released) = ROW((lease._freed(l, NULL)).*)
          FROM (SELECT o.key_hash, o.group_id, i.ord
                  FROM lease._many_input(keys, epochs, key_hashes, todo) AS i
                  JOIN lease.leases AS o
                    ON o.key_hash = i.key_hash AND o.key = i.key COLLATE "C" AND o.owner = _many_write.owner COLLATE "C"
                   AND o.epoch = i.epoch AND lease._live(o)
                 ORDER BY o.key_hash
                   FOR NO KEY UPDATE OF o) AS d
         WHERE l.key_hash = d.key_hash
        RETURNING d.ord, l.key_hash, d.group_id
    )
    SELECT array_agg(r.ord ORDER BY r.ord), array_agg(r.key_hash),
           array_agg(r.group_id) FILTER (WHERE r.group_id IS NOT NULL)
      INTO ords, v_hashes, v_groups
      FROM released AS r;
    PERFORM lease._left_groups(v_groups);
    FOREACH v_hash IN ARRAY COALESCE(v_hashes, ARRAY[]::bytea[]) LOOP
        PERFORM lease._on_change(v_hash, 'lease_released');
    END LOOP;
END;
$$;

-- The one body of lease.renew_many and lease.release_many (`op` names the
-- call; `ttl` is NULL for a release), after their shape checks: the
-- namespaces, then passes of lease._many_write. A pass writes every key
-- still to answer, or nothing: when some key did not match, the write may
-- still have locked the newest version of its row (a lock waits, then
-- checks the grant again, as in lease.renew), so the pass is rolled back,
-- the answers are read from a fresh snapshot (lease._status, the single
-- call's answer), and the keys whose grants match after all are tried
-- again. Expiries are NULL for a release and for every refusal.
CREATE OR REPLACE FUNCTION lease._many(op text, keys text[], owner text, epochs bigint[], ttl interval,
                            key_hashes bytea[])
RETURNS TABLE (key text, status text, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_todo bigint[];             -- ordinals to try in this pass; NULL: all
    v_status text[];             -- by ordinal; NULL: no answer yet
    v_expires timestamptz[];     -- by ordinal
    v_done record;               -- this pass's lease._many_write
    v_whole boolean;             -- this pass wrote every key it tried
BEGIN
    IF lease._any_rules() THEN
        PERFORM lease._check_many_keys(op, keys, epochs, key_hashes);
        PERFORM lease._raise_forbidden_many(op, keys);
    END IF;
    FOR v_pass IN 1..3 LOOP
        BEGIN
            v_done := lease._many_write(op, keys, owner, epochs, ttl, key_hashes, v_todo);
            v_whole := COALESCE(cardinality(v_done.ords), 0) = COALESCE(cardinality(v_todo), cardinality(keys));
            IF NOT v_whole THEN
                RAISE EXCEPTION USING ERRCODE = 'LH001';   -- roll the pass and its locks back
            END IF;
        EXCEPTION WHEN SQLSTATE 'LH001' THEN
            NULL;
        END;
        IF v_whole THEN
            IF v_status IS NULL THEN
                -- The common case: every key written by the first pass.
                v_status := array_fill('ok'::text, ARRAY[cardinality(keys)]);
                v_expires := v_done.expires;
            END IF;
            FOR v_i IN 1..COALESCE(cardinality(v_done.ords), 0) LOOP
                v_status[v_done.ords[v_i]] := 'ok';
                v_expires[v_done.ords[v_i]] := v_done.expires[v_i];
            END LOOP;
            IF v_done.ords IS NOT NULL THEN
                PERFORM lease._make_durable();
            END IF;
            RETURN QUERY
                SELECT k.key, k.status, k.expires_at FROM unnest(keys, v_status, v_expires) AS k(key, status, expires_at);
            RETURN;
        END IF;
        IF v_status IS NULL THEN
            -- Some key did not match: the per-key input rules first.
            PERFORM lease._check_many_keys(op, keys, epochs, key_hashes);
            v_status := array_fill(NULL::text, ARRAY[cardinality(keys)]);
            v_expires := array_fill(NULL::timestamptz, ARRAY[cardinality(keys)]);
        END IF;
        SELECT array_agg(s.status ORDER BY s.ord), array_agg(s.ord ORDER BY s.ord) FILTER (WHERE s.status IS NULL)
          INTO v_status, v_todo
          FROM (SELECT k.ord,
                       COALESCE(k.status, NULLIF(lease._status(lease._key_hash(k.key), k.key, _many.owner, k.epoch), 'ok'))
                           AS status
                  FROM unnest(keys, epochs, v_status) WITH ORDINALITY AS k(key, epoch, status, ord)) AS s;
        IF v_todo IS NULL THEN
            -- Every key refused: nothing changed.
            RETURN QUERY SELECT k.key, k.status, NULL::timestamptz FROM unnest(keys, v_status) AS k(key, status);
            RETURN;
        END IF;
    END LOOP;
    PERFORM lease._raise_contention(op, keys[v_todo[1]]);
END;
$$;

-- Extends every grant (keys[i], owner, epochs[i]) that is live to now + ttl
-- and answers, per key and in input order, what lease.renew would
-- (docs/SPECIFICATION.md §1.3): `ok` with the new expiry, or not_owner,
-- lapsed or epoch_mismatch with a NULL expiry and nothing changed for that
-- key. Renewed keys' rows stay locked until the caller's transaction ends;
-- refused keys lock nothing. The common path is one write of every key
-- (lease._many).
CREATE OR REPLACE FUNCTION lease.renew_many(keys text[], owner text, epochs bigint[], ttl interval,
                                 key_hashes bytea[] DEFAULT NULL)
RETURNS TABLE (key text, status text, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT (lease._many_shape_ok(keys, epochs, key_hashes) AND lease._name_ok(owner) AND lease._ttl_ok(ttl)) THEN
        PERFORM lease._raise_invalid('renew_many',
            lease._many_violations(keys, epochs, key_hashes) || lease._text_violations('owner', owner)
            || lease._ttl_violations(ttl));
    END IF;
    RETURN QUERY SELECT m.key, m.status, m.expires_at
                   FROM lease._many('renew_many', keys, owner, epochs, ttl, key_hashes) AS m;
END;
$$;

-- Ends every grant (keys[i], owner, epochs[i]) that is live, each key
-- becoming FREE with its counter one higher, and answers per key, in input
-- order, what lease.release would (docs/SPECIFICATION.md §1.3). Released
-- keys' rows stay locked until the caller's transaction ends, and each
-- release wakes the key's waiters; refused keys lock nothing.
CREATE OR REPLACE FUNCTION lease.release_many(keys text[], owner text, epochs bigint[],
                                   key_hashes bytea[] DEFAULT NULL)
RETURNS TABLE (key text, status text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT (lease._many_shape_ok(keys, epochs, key_hashes) AND lease._name_ok(owner)) THEN
        PERFORM lease._raise_invalid('release_many',
            lease._many_violations(keys, epochs, key_hashes) || lease._text_violations('owner', owner));
    END IF;
    RETURN QUERY SELECT m.key, m.status
                   FROM lease._many('release_many', keys, owner, epochs, NULL, key_hashes) AS m;
END;
$$;

-- Heartbeat groups (docs/SPECIFICATION.md §1.9). lease.join_group renews
-- a set of one owner's grants, exactly as lease.renew_many does, and puts
-- the renewed ones into a new group whose expiry is theirs; from then on
-- lease.renew_group keeps all of them alive by writing the group's one
-- row. A grant in a group is live until the later of its own expiry and
-- its group's (lease._expiry), so everything that asks whether a grant is
-- live (a takeover, a renew, a release, a guard's check, inspect, pruning)
-- sees the group's heartbeat. What a group does not change: epochs (a
-- heartbeat is a renewal), the per-key calls (a member can still be
-- renewed or released on its own), and who may act on a key.
--
-- Answers as lease.renew_many does, plus `group_id`, the same on every
-- row: the new group, or NULL when no key was renewed (then no group is
-- made). A renewed key that was in another group moves to the new one.
CREATE OR REPLACE FUNCTION lease.join_group(keys text[], owner text, epochs bigint[], ttl interval,
                                 key_hashes bytea[] DEFAULT NULL)
RETURNS TABLE (key text, status text, expires_at timestamptz, group_id bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_keys text[];
    v_status text[];
    v_expires timestamptz[];
    v_renewed bytea[];
    v_group bigint;
    v_violations text[];
BEGIN
    -- Every input rule first, named for this call: a join is rare, so it
    -- lists the violations at once instead of testing a hot-path condition
    -- first as renew_many does. Then the namespaces; the renewal itself is
    -- renew_many's.
    v_violations := lease._many_violations(keys, epochs, key_hashes)
        || lease._text_violations('owner', owner) || lease._ttl_violations(ttl);
    IF cardinality(v_violations) > 0 THEN
        PERFORM lease._raise_invalid('join_group', v_violations);
    END IF;
    IF lease._any_rules() THEN
        PERFORM lease._raise_forbidden_many('join_group', keys);
    END IF;
    SELECT array_agg(r.key ORDER BY r.ord), array_agg(r.status ORDER BY r.ord),
           array_agg(r.expires_at ORDER BY r.ord)
      INTO v_keys, v_status, v_expires
      FROM lease.renew_many(join_group.keys, join_group.owner, join_group.epochs, join_group.ttl,
                            join_group.key_hashes) WITH ORDINALITY AS r(key, status, expires_at, ord);
    SELECT array_agg(lease._key_hash(k.key)) INTO v_renewed
      FROM unnest(v_keys, v_status) AS k(key, status)
     WHERE k.status = 'ok';
    IF v_renewed IS NOT NULL THEN
        -- The renewal locked these rows, so their group_id is current.
        -- A new random id; three collisions of 63 random bits in a row do
        -- not happen, but the loop is bounded all the same.
        FOR v_try IN 1..3 LOOP
            INSERT INTO lease.groups AS g (id, owner, expires_at, members)
            VALUES (('x' || translate(gen_random_uuid()::text, '-', ''))::bit(64)::bigint & 9223372036854775807,
                    join_group.owner, (SELECT max(e.at) FROM unnest(v_expires) AS e(at)), cardinality(v_renewed))
            ON CONFLICT (id) DO NOTHING
            RETURNING g.id INTO v_group;
            EXIT WHEN FOUND;
        END LOOP;
        IF v_group IS NULL THEN
            PERFORM lease._raise_contention('join_group', keys[1]);
        END IF;
        PERFORM lease._left_groups(
            (SELECT array_agg(l.group_id) FROM lease.leases AS l
              WHERE l.key_hash = ANY (v_renewed) AND l.group_id IS NOT NULL));
        UPDATE lease.leases AS l SET group_id = v_group WHERE l.key_hash = ANY (v_renewed);
    END IF;
    RETURN QUERY
        SELECT k.key, k.status, k.expires_at, v_group
          FROM unnest(v_keys, v_status, v_expires) AS k(key, status, expires_at);
END;
$$;

-- One heartbeat for every grant of group `group_id`: extends the group to
-- now + ttl while it is live and owned by `owner`, in one row write.
-- Answers `ok` with the new expiry and `members`, the number of grants
-- still in the group (a caller that counts fewer than it put in lost some:
-- released, force-released, or taken over after the group lapsed, and
-- asks lease.renew_many which); `lapsed` when the group's expiry passed
-- (it is never extended again: join the keys that are still live to a new
-- group); `not_owner` when there is no such group or another owner's.
-- Refusals change nothing and lock nothing. With namespace rules, every
-- member is checked as lease.renew_many checks its keys (§4.2).
CREATE OR REPLACE FUNCTION lease.renew_group(group_id bigint, owner text, ttl interval)
RETURNS TABLE (status text, expires_at timestamptz, members integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_row record;
BEGIN
    IF group_id IS NULL OR NOT lease._name_ok(owner)
       OR NOT lease._ttl_ok(ttl) THEN
        PERFORM lease._raise_invalid('renew_group',
            CASE WHEN group_id IS NULL THEN ARRAY['group_id must not be NULL'] ELSE ARRAY[]::text[] END
            || lease._text_violations('owner', owner) || lease._ttl_violations(ttl));
    END IF;
    IF lease._any_rules() THEN
        PERFORM lease._raise_forbidden_many('renew_group',
            (SELECT array_agg(l.key ORDER BY l.key) FROM lease.leases AS l
              WHERE l.group_id = renew_group.group_id));
    END IF;
    -- In a subtransaction, rolled back when nothing was renewed, for the
    -- reason lease.renew gives.
    BEGIN
        UPDATE lease.groups AS g
           SET expires_at = lease._expires_in(renew_group.ttl)
         WHERE g.id = renew_group.group_id AND g.owner = renew_group.owner COLLATE "C"
           AND lease._group_live(g)
        RETURNING g.expires_at, g.members INTO renew_group.expires_at, renew_group.members;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'LH001';
        END IF;
        PERFORM lease._make_durable();
        status := 'ok';
        RETURN NEXT;
        RETURN;
    EXCEPTION WHEN SQLSTATE 'LH001' THEN
        NULL;
    END;
    SELECT g.owner INTO v_row FROM lease.groups AS g WHERE g.id = renew_group.group_id;
    status := CASE WHEN NOT FOUND OR v_row.owner <> renew_group.owner COLLATE "C" THEN 'not_owner' ELSE 'lapsed' END;
    expires_at := NULL;
    members := NULL;
    RETURN NEXT;
END;
$$;

GRANT EXECUTE ON FUNCTION lease.join_group(text[], text, bigint[], interval, bytea[]) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.renew_group(bigint, text, interval) TO PUBLIC;
REVOKE ALL ON FUNCTION lease._many_shape_ok(text[], bigint[], bytea[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._many_violations(text[], bigint[], bytea[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._check_many_keys(text, text[], bigint[], bytea[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._raise_forbidden_many(text, text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._many_input(text[], bigint[], bytea[], bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._many_write(text, text[], text, bigint[], interval, bytea[], bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._many(text, text[], text, bigint[], interval, bytea[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lease.renew_many(text[], text, bigint[], interval, bytea[]) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.release_many(text[], text, bigint[], bytea[]) TO PUBLIC;

-- Every file of functions and every migration ends so (see
-- lease._drop_default_grants).
SELECT lease._drop_default_grants();
