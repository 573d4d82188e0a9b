-- leasehold: safe pruning (docs/SPECIFICATION.md §1.8, docs/INVARIANTS.md
-- I16). Removes the rows of keys nobody uses any more (FREE, or LAPSED,
-- for longer than an operator-chosen idle time), the guard records of
-- resources fenced only by such keys, and the waiter rows of gone sessions
-- for those keys, without ever letting an epoch be granted twice, go back,
-- or be admitted again where it was stale.
--
-- The rules of migration 000001_tables apply. Like the operator actions of
-- 05_operator.sql, the prune functions are granted to nobody: the installing role runs them or grants EXECUTE on
-- them (docs/guide/security.md).
--
-- The argument, in short (docs/SPECIFICATION.md §1.8 has it in full):
--
-- * Counters. A prune raises lease.lineage.pruned_through to at least the
--   counter of every key row it deletes, in the transaction that deletes
--   them. A snapshot that no longer sees a pruned row sees the raised
--   watermark, and lease.acquire reads the watermark only after it found
--   the key's row missing, so a key that comes back gets a first epoch of
--   at least pruned_through + 1: above every epoch it ever had (I3 holds
--   across a prune). The first epoch is remembered in
--   lease.leases.first_epoch.
-- * Guards. lease.admit refuses an epoch above the key's counter, and every
--   epoch of a key without a row (G7), and refuses as stale an epoch below
--   the first epoch of the key's row: an epoch of a pruned incarnation. A
--   guard record is pruned only when every epoch it refuses is refused that
--   way anyway: its key has no row, or the key's row has a first epoch
--   above the record's accepted epoch (strictly above, so that the records
--   a live incarnation wrote, whose accepted epochs are at least its first
--   epoch, stay while it lives). Every record of a key was written
--   while the key's row existed (admission locks it, a prune locks it FOR
--   UPDATE), so its accepted epoch is at most that row's counter + 1, which
--   is at most the watermark + 1 once the row is pruned.
-- * Concurrency. Every batch is one short transaction in the caller's hands
--   (the Rust client commits each). Rows are locked FOR UPDATE SKIP LOCKED:
--   a row any other transaction holds a lock on (a grant in progress, a
--   renew, a lease-checked write's FOR KEY SHARE) is skipped, never waited
--   for, and the prunable condition is checked again on the newest version
--   of every row locked (READ COMMITTED), so a row that became held is never
--   deleted. A grant that meets a row the pruner locked waits for the
--   batch, within its own lock budget, and then finds the row gone and
--   inserts it anew above the watermark.
--
-- Idle time. A LAPSED row has been idle since its expiry. A FREE row keeps
-- no timestamp (its release writes none, and release is a hot path), so a
-- prune records a sighting (key, counter, time) the first time it sees a
-- FREE row at a counter, and removes the row only when a later prune finds
-- it FREE at the same counter at least the idle time after the sighting:
-- every grant moves the counter on, so an unchanged counter means no grant
-- in between. Idle time is a matter of usefulness, not of safety: the
-- argument above holds for any FREE or LAPSED row.

SET LOCAL lock_timeout = '5s';

-- Raises invalid_input (22023, lease_invalid_input) for a prune's
-- arguments, or returns when they are fine: idle is a span judged as a ttl
-- is (positive, at most 100 years, by the time it spans from now), batch
-- between 1 and 100 000.
CREATE OR REPLACE FUNCTION lease._check_prune_input(caller text, idle interval, batch integer)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_violations text[];
BEGIN
    IF lease._ttl_ok(idle) AND batch BETWEEN 1 AND 100000 THEN
        RETURN;
    END IF;
    v_violations := lease._span_violations('idle', idle, false)
        || CASE
            WHEN batch IS NULL THEN ARRAY['batch must not be NULL']
            WHEN batch < 1 OR batch > 100000 THEN ARRAY['batch must be between 1 and 100000']
            ELSE ARRAY[]::text[]
        END;
    RAISE EXCEPTION 'invalid input to lease.%: %', caller, array_to_string(v_violations, '; ')
        USING ERRCODE = '22023',
              CONSTRAINT = 'lease_invalid_input',
              DETAIL = array_to_string(v_violations, '; '),
              HINT = 'Pass a positive idle time of at most 100 years and a batch between 1 and 100000.';
END;
$$;

-- One batch of lease.prune_keys' deletions: the key rows in (after, upper]
-- prunable after `idle` (lapsed that long, or FREE and sighted at the same
-- counter that long ago), with their sightings and the waiter rows of gone
-- sessions, the watermark raised past every counter deleted. Locks what is
-- prunable FOR UPDATE SKIP LOCKED: the condition is checked again on the
-- newest version of each row locked, and rows others hold locks on are
-- skipped.
CREATE OR REPLACE FUNCTION lease._prune_key_rows(idle interval, after bytea, upper bytea,
                                      OUT pruned integer, OUT waiters integer)
RETURNS record
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_hashes bytea[];
    v_max bigint;
BEGIN
    -- Lock what is prunable; the condition is checked again on the
    -- newest version of each row locked, and rows others hold locks on
    -- are skipped.
    SELECT array_agg(d.key_hash) INTO v_hashes
      FROM (SELECT l.key_hash
              FROM lease.leases AS l
             WHERE (_prune_key_rows.after IS NULL OR l.key_hash > _prune_key_rows.after) AND l.key_hash <= upper
               AND (lease._lapsed_for(l, _prune_key_rows.idle)
                    OR (l.owner IS NULL
                        AND EXISTS (SELECT 1 FROM lease.prune_sightings AS s
                                     WHERE s.key_hash = l.key_hash AND s.epoch = l.epoch
                                       AND s.seen_at <= lease._idle_cutoff(_prune_key_rows.idle))))
               FOR UPDATE OF l SKIP LOCKED) AS d;
    pruned := 0;
    waiters := 0;
    IF v_hashes IS NOT NULL THEN
        WITH gone AS (
            DELETE FROM lease.leases AS l
             WHERE l.key_hash = ANY (v_hashes)
            RETURNING l.epoch
        )
        SELECT count(*)::integer, max(gone.epoch) INTO pruned, v_max FROM gone;
        -- The watermark, in the transaction that deletes the rows.
        UPDATE lease.lineage AS g
           SET pruned_through = v_max
         WHERE g.singleton AND g.pruned_through < v_max;
        DELETE FROM lease.prune_sightings AS s WHERE s.key_hash = ANY (v_hashes);
        DELETE FROM lease.waiters AS w
         WHERE w.key_hash = ANY (v_hashes)
           AND NOT EXISTS (SELECT 1 FROM pg_stat_activity AS a WHERE a.pid = w.backend_pid);
        GET DIAGNOSTICS waiters = ROW_COUNT;
    END IF;
END;
$$;

-- One batch of key pruning: looks at the (at most `batch`) key rows whose
-- digest follows `after` (NULL: from the start) and removes those that
-- are LAPSED since before now - idle, or FREE at the counter a sighting
-- recorded before now - idle; records sightings of the other FREE rows;
-- removes the sightings of the removed rows and their waiter rows whose
-- session is gone; raises the watermark to the removed counters. With
-- dry_run nothing is written or locked: `pruned` and `sighted` say what
-- the batch would do.
--
-- Returns: examined (rows looked at), pruned, sighted, waiters (rows
-- removed), the watermark after the batch, and next_after, the digest to
-- pass as `after` for the next batch (NULL when this batch reached the
-- end). Locks only the rows it removes, FOR UPDATE, until the caller's
-- transaction ends: commit after every batch.
CREATE OR REPLACE FUNCTION lease.prune_keys(idle interval, after bytea DEFAULT NULL, batch integer DEFAULT 1000,
                                 dry_run boolean DEFAULT false)
RETURNS TABLE (examined integer, pruned integer, sighted integer, waiters integer,
               watermark bigint, next_after bytea)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz;
    v_upper bytea;
BEGIN
    PERFORM lease._check_prune_input('prune_keys', idle, batch);
    v_now := clock_timestamp();
    waiters := 0;
    SELECT count(*)::integer, (array_agg(w.key_hash ORDER BY w.key_hash DESC))[1]
        INTO examined, v_upper
      FROM (SELECT l.key_hash FROM lease.leases AS l
             WHERE prune_keys.after IS NULL OR l.key_hash > prune_keys.after
             ORDER BY l.key_hash
             LIMIT prune_keys.batch) AS w;
    next_after := CASE WHEN examined = batch THEN v_upper END;
    -- Heartbeat groups lapsed for at least `idle`, once per pass (its
    -- first batch). A lapsed group is never renewed again, so its members'
    -- liveness is their own expiry alone; their group_id is cleared in the
    -- same statement, so no row names a group that is gone.
    IF NOT dry_run AND prune_keys.after IS NULL THEN
        WITH gone AS (
            DELETE FROM lease.groups AS g WHERE lease._group_lapsed_for(g, prune_keys.idle)
            RETURNING g.id
        )
        UPDATE lease.leases AS l SET group_id = NULL FROM gone WHERE l.group_id = gone.id;
    END IF;
    IF examined = 0 THEN
        pruned := 0;
        sighted := 0;
    ELSIF dry_run THEN
        SELECT count(*) FILTER (WHERE lease._lapsed_for(l, prune_keys.idle)
                                   OR (l.owner IS NULL AND s.seen_at <= lease._idle_cutoff(prune_keys.idle) AND s.epoch = l.epoch))::integer,
               count(*) FILTER (WHERE l.owner IS NULL AND s.epoch IS DISTINCT FROM l.epoch)::integer
          INTO pruned, sighted
          FROM lease.leases AS l
          LEFT JOIN lease.prune_sightings AS s ON s.key_hash = l.key_hash
         WHERE (prune_keys.after IS NULL OR l.key_hash > prune_keys.after) AND l.key_hash <= v_upper;
    ELSE
        SELECT d.pruned, d.waiters INTO pruned, waiters
          FROM lease._prune_key_rows(prune_keys.idle, prune_keys.after, v_upper) AS d;
        INSERT INTO lease.prune_sightings AS s (key_hash, epoch, seen_at)
        SELECT l.key_hash, l.epoch, v_now
          FROM lease.leases AS l
         WHERE (prune_keys.after IS NULL OR l.key_hash > prune_keys.after) AND l.key_hash <= v_upper
           AND l.owner IS NULL
           AND NOT EXISTS (SELECT 1 FROM lease.prune_sightings AS s2
                            WHERE s2.key_hash = l.key_hash AND s2.epoch = l.epoch)
        ON CONFLICT (key_hash) DO UPDATE
           SET epoch = excluded.epoch, seen_at = excluded.seen_at;
        GET DIAGNOSTICS sighted = ROW_COUNT;
        IF pruned > 0 AND current_setting('synchronous_commit') IN ('off', 'local') THEN
            PERFORM set_config('synchronous_commit', 'on', true);
        END IF;
    END IF;
    SELECT g.pruned_through INTO watermark FROM lease.lineage AS g WHERE g.singleton;
    RETURN NEXT;
END;
$$;

-- One batch of guard pruning: looks at the (at most `batch`) guard records
-- whose digest follows `after` and removes those not updated since before
-- now - idle whose every refusal the key's own checks repeat: the key has
-- no row (lease.admit refuses all its epochs until it comes back above the
-- watermark), or the key's row has a first epoch above the record's
-- accepted epoch (a record of an incarnation that was pruned; the records
-- of the live incarnation have accepted epochs at or above its first
-- epoch). Run it after lease.prune_keys: a record goes only after its
-- key's row. With dry_run nothing is written or locked.
--
-- Returns: examined, pruned, and next_after (as lease.prune_keys). Locks
-- only the records it removes, until the caller's transaction ends.
CREATE OR REPLACE FUNCTION lease.prune_guards(idle interval, after bytea DEFAULT NULL, batch integer DEFAULT 1000,
                                   dry_run boolean DEFAULT false)
RETURNS TABLE (examined integer, pruned integer, next_after bytea)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_upper bytea;
    v_hashes bytea[];
BEGIN
    PERFORM lease._check_prune_input('prune_guards', idle, batch);
    SELECT count(*)::integer, (array_agg(w.resource_hash ORDER BY w.resource_hash DESC))[1]
        INTO examined, v_upper
      FROM (SELECT g.resource_hash FROM lease.guards AS g
             WHERE prune_guards.after IS NULL OR g.resource_hash > prune_guards.after
             ORDER BY g.resource_hash
             LIMIT prune_guards.batch) AS w;
    next_after := CASE WHEN examined = batch THEN v_upper END;
    pruned := 0;
    IF examined = 0 THEN
        RETURN NEXT;
        RETURN;
    END IF;
    IF dry_run THEN
        SELECT count(*)::integer INTO pruned
          FROM lease.guards AS g
         WHERE (prune_guards.after IS NULL OR g.resource_hash > prune_guards.after)
           AND g.resource_hash <= v_upper
           AND g.updated_at <= lease._idle_cutoff(prune_guards.idle)
           AND NOT EXISTS (SELECT 1 FROM lease.leases AS l
                            WHERE l.key_hash = lease._key_hash(g.lease_key) AND l.key = g.lease_key
                              AND l.first_epoch <= g.accepted_epoch);
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT array_agg(d.resource_hash) INTO v_hashes
      FROM (SELECT g.resource_hash
              FROM lease.guards AS g
             WHERE (prune_guards.after IS NULL OR g.resource_hash > prune_guards.after)
               AND g.resource_hash <= v_upper
               AND g.updated_at <= lease._idle_cutoff(prune_guards.idle)
               AND NOT EXISTS (SELECT 1 FROM lease.leases AS l
                                WHERE l.key_hash = lease._key_hash(g.lease_key) AND l.key = g.lease_key
                                  AND l.first_epoch <= g.accepted_epoch)
               FOR UPDATE OF g SKIP LOCKED) AS d;
    IF v_hashes IS NOT NULL THEN
        DELETE FROM lease.guards AS g WHERE g.resource_hash = ANY (v_hashes);
        GET DIAGNOSTICS pruned = ROW_COUNT;
        IF current_setting('synchronous_commit') IN ('off', 'local') THEN
            PERFORM set_config('synchronous_commit', 'on', true);
        END IF;
    END IF;
    RETURN NEXT;
END;
$$;

REVOKE ALL ON FUNCTION lease._check_prune_input(text, interval, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._prune_key_rows(interval, bytea, bytea) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease.prune_keys(interval, bytea, integer, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease.prune_guards(interval, bytea, integer, boolean) FROM PUBLIC;

-- Every file of functions and every migration ends so (see
-- lease._drop_default_grants).
SELECT lease._drop_default_grants();
