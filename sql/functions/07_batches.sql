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
-- * Lock order. The UPDATE meets, and so locks, the matching rows in
--   key_hash order, whatever the order of the input (see "The plan
--   settings" below), so two batch calls over overlapping keys queue on
--   their first common key instead of deadlocking (tested in
--   tests/leasehold/many_keys.rs).
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

-- The plan settings of the batch functions. A batch's UPDATE joins its
-- keys, sorted by key_hash, to lease.leases; it must be a nested loop that
-- looks each key up in the primary key in that order, because the order in
-- which the loop meets the rows is the order in which the UPDATE locks
-- them, and a fixed order is what keeps two batches over the same keys
-- from deadlocking. A hash or merge join, or a sequential scan of the
-- table, would lock in the table's order instead; they are switched off
-- for the call only (the SET clauses restore the caller's settings on
-- return), which leaves the planner the nested loop as its only choice
-- that is not penalised, whatever the table's statistics. JIT is switched
-- off because the penalties would otherwise push the estimated cost over
-- jit_above_cost and a single call would spend a third of a second
-- compiling.

-- Extends every grant (keys[i], owner, epochs[i]) that is live to now + ttl
-- and answers, per key and in input order, what lease.renew would
-- (docs/SPECIFICATION.md §1.3): `ok` with the new expiry, or not_owner,
-- lapsed or epoch_mismatch with a NULL expiry and nothing changed for that
-- key. Renewed keys' rows stay locked until the caller's transaction ends;
-- refused keys lock nothing.
--
-- The common path is one UPDATE of every key. Only when some key was not
-- renewed are the statuses read, from a fresh snapshot, as lease.renew
-- does; a key whose grant matches after all (a change committed after the
-- UPDATE looked) is tried again in another pass.
CREATE OR REPLACE FUNCTION lease.renew_many(keys text[], owner text, epochs bigint[], ttl interval,
                                 key_hashes bytea[] DEFAULT NULL)
RETURNS TABLE (key text, status text, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_hashjoin = off
SET enable_mergejoin = off
SET enable_seqscan = off
SET enable_material = off
SET jit = off
AS $$
DECLARE
    v_todo bigint[];             -- ordinals to try in this pass; NULL: all
    v_status text[];             -- by ordinal; NULL: no answer yet
    v_expires timestamptz[];     -- by ordinal
    v_done bigint[];             -- ordinals renewed in this pass
    v_done_expires timestamptz[];
    v_whole boolean;             -- this pass renewed every key it tried
BEGIN
    IF NOT lease._many_shape_ok(keys, epochs, key_hashes)
       OR NOT lease._name_ok(owner)
       OR NOT lease._ttl_ok(ttl) THEN
        PERFORM lease._raise_invalid('renew_many',
            lease._many_violations(keys, epochs, key_hashes) || lease._text_violations('owner', owner)
            || lease._ttl_violations(ttl));
    END IF;
    IF lease._any_rules() THEN
        PERFORM lease._check_many_keys('renew_many', keys, epochs, key_hashes);
        PERFORM lease._raise_forbidden_many('renew_many', keys);
    END IF;
    FOR v_pass IN 1..3 LOOP
        -- A pass renews every key still to answer, or nothing: when some key
        -- was not renewed, the UPDATE may still have locked the newest
        -- version of its row (it locks before it checks the grant again,
        -- as in lease.renew), so the pass is rolled back, the answers are
        -- read, and the keys whose grants match are tried again.
        v_whole := false;
        BEGIN
            WITH renewed AS (
                UPDATE lease.leases AS l
                   SET expires_at = lease._expires_in(renew_many.ttl)
                  FROM (SELECT k.key, k.epoch, k.ord, COALESCE(k.given_hash, lease._key_hash(k.key)) AS key_hash
                          FROM unnest(renew_many.keys, renew_many.epochs, renew_many.key_hashes)
                               WITH ORDINALITY AS k(key, epoch, given_hash, ord)
                         WHERE v_todo IS NULL OR k.ord = ANY (v_todo)
                         ORDER BY key_hash
                        OFFSET 0) AS i   -- OFFSET 0: keep the sorted input a subquery
                 WHERE l.key_hash = i.key_hash AND l.key = i.key COLLATE "C" AND l.owner = renew_many.owner COLLATE "C"
                   AND l.epoch = i.epoch AND lease._live(l)
                RETURNING i.ord, l.expires_at
            )
            SELECT array_agg(r.ord ORDER BY r.ord), array_agg(r.expires_at ORDER BY r.ord)
              INTO v_done, v_done_expires
              FROM renewed AS r;
            IF COALESCE(cardinality(v_done), 0) <> COALESCE(cardinality(v_todo), cardinality(keys)) THEN
                RAISE EXCEPTION USING ERRCODE = 'LH001';
            END IF;
            v_whole := true;
        EXCEPTION WHEN SQLSTATE 'LH001' THEN
            NULL;
        END;
        IF v_whole THEN
            IF v_status IS NULL THEN
                -- The common case: every key renewed by the first pass.
                v_status := array_fill('ok'::text, ARRAY[cardinality(keys)]);
                v_expires := v_done_expires;
            END IF;
            FOR v_i IN 1..COALESCE(cardinality(v_done), 0) LOOP
                v_status[v_done[v_i]] := 'ok';
                v_expires[v_done[v_i]] := v_done_expires[v_i];
            END LOOP;
            IF v_done IS NOT NULL THEN
                PERFORM lease._make_durable();
            END IF;
            RETURN QUERY
                SELECT k.key, k.status, k.expires_at
                  FROM unnest(renew_many.keys, v_status, v_expires) AS k(key, status, expires_at);
            RETURN;
        END IF;
        IF v_status IS NULL THEN
            -- Some key did not match: the per-key input rules first.
            PERFORM lease._check_many_keys('renew_many', keys, epochs, key_hashes);
            v_status := array_fill(NULL::text, ARRAY[cardinality(keys)]);
            v_expires := array_fill(NULL::timestamptz, ARRAY[cardinality(keys)]);
        END IF;
        -- Why the keys were not renewed: lease._status, the single renew's
        -- answer (its own fresh snapshot per key, and refusals only); NULL,
        -- to try again, where the grant matches.
        SELECT array_agg(s.status ORDER BY s.ord),
               array_agg(s.ord ORDER BY s.ord) FILTER (WHERE s.status IS NULL)
          INTO v_status, v_todo
          FROM (SELECT k.ord,
                       COALESCE(k.status,
                                NULLIF(lease._status(lease._key_hash(k.key), k.key, renew_many.owner, k.epoch), 'ok'))
                           AS status
                  FROM unnest(renew_many.keys, renew_many.epochs, v_status)
                       WITH ORDINALITY AS k(key, epoch, status, ord)) AS s;
        IF v_todo IS NULL THEN
            -- Every key refused: nothing changed.
            RETURN QUERY
                SELECT k.key, k.status, NULL::timestamptz
                  FROM unnest(renew_many.keys, v_status) AS k(key, status);
            RETURN;
        END IF;
    END LOOP;
    PERFORM lease._raise_contention('renew_many', keys[v_todo[1]]);
END;
$$;

-- Ends every grant (keys[i], owner, epochs[i]) that is live, each key
-- becoming FREE with its counter one higher, and answers per key, in input
-- order, what lease.release would (docs/SPECIFICATION.md §1.3). Released
-- keys' rows stay locked until the caller's transaction ends, and each
-- release wakes the key's waiters (lease._on_change per released key, as
-- lease.release calls it); refused keys lock nothing. Same passes and plan settings as
-- lease.renew_many.
CREATE OR REPLACE FUNCTION lease.release_many(keys text[], owner text, epochs bigint[],
                                   key_hashes bytea[] DEFAULT NULL)
RETURNS TABLE (key text, status text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_hashjoin = off
SET enable_mergejoin = off
SET enable_seqscan = off
SET enable_material = off
SET jit = off
AS $$
DECLARE
    v_todo bigint[];
    v_status text[];
    v_done bigint[];
    v_done_hashes bytea[];
    v_left_groups bigint[];
    v_hash bytea;
    v_whole boolean;
BEGIN
    IF NOT lease._many_shape_ok(keys, epochs, key_hashes)
       OR NOT lease._name_ok(owner) THEN
        PERFORM lease._raise_invalid('release_many',
            lease._many_violations(keys, epochs, key_hashes) || lease._text_violations('owner', owner));
    END IF;
    IF lease._any_rules() THEN
        PERFORM lease._check_many_keys('release_many', keys, epochs, key_hashes);
        PERFORM lease._raise_forbidden_many('release_many', keys);
    END IF;
    FOR v_pass IN 1..3 LOOP
        -- A pass releases every key still to answer, or nothing, as in
        -- lease.renew_many. The matching rows are locked first (`d`, in
        -- key_hash order, as there), so that the heartbeat group each one
        -- leaves is read from its newest version; the UPDATE then writes
        -- exactly those rows.
        v_whole := false;
        BEGIN
            WITH released AS (
                UPDATE lease.leases AS l
                   SET (key, key_hash, owner, epoch, expires_at, lapsed_owner, first_epoch, group_id, force_released) = ROW((lease._freed(l, NULL)).*)
                  FROM (SELECT o.key_hash, o.group_id, i.ord
                          FROM (SELECT k.key, k.epoch, k.ord, COALESCE(k.given_hash, lease._key_hash(k.key)) AS key_hash
                                  FROM unnest(release_many.keys, release_many.epochs, release_many.key_hashes)
                                       WITH ORDINALITY AS k(key, epoch, given_hash, ord)
                                 WHERE v_todo IS NULL OR k.ord = ANY (v_todo)
                                 ORDER BY key_hash
                                OFFSET 0) AS i
                          JOIN lease.leases AS o
                            ON o.key_hash = i.key_hash AND o.key = i.key COLLATE "C" AND o.owner = release_many.owner COLLATE "C"
                           AND o.epoch = i.epoch AND lease._live(o)
                           FOR NO KEY UPDATE OF o) AS d
                 WHERE l.key_hash = d.key_hash
                RETURNING d.ord, l.key_hash, d.group_id
            )
            SELECT array_agg(r.ord), array_agg(r.key_hash), array_agg(r.group_id) FILTER (WHERE r.group_id IS NOT NULL)
              INTO v_done, v_done_hashes, v_left_groups
              FROM released AS r;
            IF COALESCE(cardinality(v_done), 0) <> COALESCE(cardinality(v_todo), cardinality(keys)) THEN
                RAISE EXCEPTION USING ERRCODE = 'LH001';
            END IF;
            PERFORM lease._left_groups(v_left_groups);
            -- Each released key wakes its waiters, as lease.release does.
            FOREACH v_hash IN ARRAY COALESCE(v_done_hashes, ARRAY[]::bytea[]) LOOP
                PERFORM lease._on_change(v_hash, 'lease_released');
            END LOOP;
            v_whole := true;
        EXCEPTION WHEN SQLSTATE 'LH001' THEN
            NULL;
        END;
        IF v_whole THEN
            IF v_status IS NULL THEN
                v_status := array_fill('ok'::text, ARRAY[cardinality(keys)]);
            END IF;
            FOR v_i IN 1..COALESCE(cardinality(v_done), 0) LOOP
                v_status[v_done[v_i]] := 'ok';
            END LOOP;
            IF v_done IS NOT NULL THEN
                PERFORM lease._make_durable();
            END IF;
            RETURN QUERY
                SELECT k.key, k.status FROM unnest(release_many.keys, v_status) AS k(key, status);
            RETURN;
        END IF;
        IF v_status IS NULL THEN
            -- Some key did not match: the per-key input rules first.
            PERFORM lease._check_many_keys('release_many', keys, epochs, key_hashes);
            v_status := array_fill(NULL::text, ARRAY[cardinality(keys)]);
        END IF;
        SELECT array_agg(s.status ORDER BY s.ord),
               array_agg(s.ord ORDER BY s.ord) FILTER (WHERE s.status IS NULL)
          INTO v_status, v_todo
          FROM (SELECT k.ord,
                       COALESCE(k.status,
                                NULLIF(lease._status(lease._key_hash(k.key), k.key, release_many.owner, k.epoch), 'ok'))
                           AS status
                  FROM unnest(release_many.keys, release_many.epochs, v_status)
                       WITH ORDINALITY AS k(key, epoch, status, ord)) AS s;
        IF v_todo IS NULL THEN
            -- Every key refused: nothing changed.
            RETURN QUERY
                SELECT k.key, k.status FROM unnest(release_many.keys, v_status) AS k(key, status);
            RETURN;
        END IF;
    END LOOP;
    PERFORM lease._raise_contention('release_many', keys[v_todo[1]]);
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
SET enable_hashjoin = off
SET enable_mergejoin = off
SET enable_seqscan = off
SET enable_material = off
SET jit = off
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
GRANT EXECUTE ON FUNCTION lease.renew_many(text[], text, bigint[], interval, bytea[]) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.release_many(text[], text, bigint[], bytea[]) TO PUBLIC;

-- Every file of functions and every migration ends so (see
-- lease._drop_default_grants).
SELECT lease._drop_default_grants();
