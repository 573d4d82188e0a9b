-- leasehold: fast paths for the common grant, renewal and release
-- (docs/PERFORMANCE.md, "Fast paths without a function call").
--
-- Why. Every API call is a PL/pgSQL SECURITY DEFINER function, because
-- ordinary roles may not write lease.leases themselves. Measured in server
-- CPU per committed call, the function boundary (the call, its executor,
-- its pinned search_path, its returned set) is a quarter to a third of a
-- call: lease.renew 24 µs against 18 µs for the same renewal through the
-- rule below, lease.acquire of a lapsed key 45 against 31 (the floor, one
-- plain UPDATE, is 8; docs/PERFORMANCE.md).
--
-- How. A rewrite rule is planned with the statement that fires it and runs
-- with its view owner's rights on the tables it names, so it gives what
-- SECURITY DEFINER gives (the caller writes lease.leases only as the rule
-- says) without a function call; a prepared statement keeps its plan. Each
-- fast path is a view of one row of NULLs whose ON UPDATE rule is, word for
-- word in effect, the common path of its function:
--
--   UPDATE lease.fast_acquire SET key = $1, owner = $2, ttl = $3 RETURNING epoch, expires_at
--   UPDATE lease.fast_renew   SET key = $1, owner = $2, epoch = $3, ttl = $4 RETURNING expires_at
--   UPDATE lease.fast_release SET key = $1, owner = $2, epoch = $3 RETURNING released
--
-- A row back means done: granted, renewed or released, with exactly the
-- effects of lease.acquire, lease.renew or lease.release. No row means the
-- fast path did not apply and changed nothing; the caller then calls the
-- function, which decides the case (a denial and why, a never-seen key, an
-- idempotent re-acquire, a wait, bad input, a namespace refusal, a
-- lineage or timeline to record) as it always has. The Rust client does
-- exactly this (src/leases.rs).
--
-- What each rule keeps (docs/SPECIFICATION.md):
-- * §1.3 the transitions and counters: the same WHERE and SET as the
--   functions' common paths (2026-11-30-000001); a grant that is not the
--   plain case (held, never seen, same owner again) finds no row here.
-- * §1.4 input: a stored key, owner and epoch were checked when stored; the
--   acquire rule checks the new owner and the ttl, the renew rule the ttl,
--   with the same inline checks as the functions (lease._plain_ttl written
--   out: that helper is not granted to PUBLIC, and the planner inlines a
--   function only for a role that may execute it). Bad input finds no row,
--   and the function then raises 22023.
-- * §1.4 durability: a rule that writes raises synchronous_commit to on for
--   the transaction, as the functions do, in its WHERE clause, so it holds
--   whether or not the statement asks for RETURNING.
-- * §1.5 locks: the grant locks the row FOR UPDATE SKIP LOCKED (never
--   waits; a locked row leaves the fast path); renew and release lock only
--   the row they write. A statement that finds no row locks nothing, with
--   one exception: a grant that locked its row but cannot write it (the
--   lineage row is not current, or the row changed after the statement's
--   snapshot) returns no row and keeps the lock until its transaction
--   ends, and lease.acquire then decides under that lock, as its own
--   common path does.
-- * §1.2/§1.7 the generation: the grant takes the epoch floor from the
--   lineage row only when that row is current (checked by this server, see
--   lease.lineage's checked_start; no newer timeline); otherwise no row,
--   and lease.acquire checks the system identifier and records the new
--   lineage, timeline or start time.
-- * §4 namespaces: while the statement's snapshot sees no row in
--   lease.namespaces there is no rule to look up (the rule reads the table
--   with the view owner's rights); otherwise lease._fast_allowed asks the
--   same question as the functions, about session_user, in the same
--   snapshot. The answer is the functions' (lease._allowed_by_rules allows
--   every name when it sees no rule), and the sub-select, run once per
--   statement, costs about 1 µs less than lease._allowed's file-size read
--   (docs/PERFORMANCE.md, "What each guarantee costs"); the
--   functions keep the size read, which the planner can inline into them.
-- * Wake-ups (2026-11-30-000003): a fast release wakes waiters the way
--   lease._on_release does, after its UPDATE, in the `released` column of
--   its RETURNING: RETURNING is computed after the row was written, and a
--   function called there takes its snapshot after the write and after the
--   advisory lock. A statement that does not ask for `released` frees the
--   key without waking anybody early; waiters then find it at their next
--   poll. The Rust client always asks for it.
-- * Name resolution: a rule's text is resolved once, here, so every name in
--   it is fixed at install time; the search_path is pinned to pg_catalog
--   while the rules are created, so no object a caller could create on the
--   installer's search_path can stand in for a built-in.
--
-- The views grant SELECT (RETURNING needs it; a SELECT shows one row of
-- NULLs) and UPDATE of their input columns to PUBLIC. lease._fast_allowed
-- and lease._fast_wake are granted to PUBLIC and built like API functions
-- (SECURITY DEFINER, pinned search_path), as the waiting protocol's entry
-- points are: they keep the `_` of plumbing that is not part of the SQL API.

SELECT pg_catalog.set_config('leasehold.installer_search_path', pg_catalog.current_setting('search_path'), true);
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

-- Whether the calling session may act on `name` by the namespace rules
-- (lease._allowed_by_rules, which reads lease.namespaces: a table PUBLIC
-- may not read, so a rule cannot call it directly). Called by the fast
-- paths only when lease.namespaces has a row. It tells the caller nothing
-- the API functions do not: whether it may act on a name.
CREATE FUNCTION lease._fast_allowed(name text)
RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN lease._allowed_by_rules(_fast_allowed.name);
END;
$$;

-- The wake-up after a fast release: lease._on_release for the key, when
-- the key is FREE. Called from the release rule's RETURNING, after its
-- UPDATE, so its read sees the key freed by the calling statement; called
-- by anybody else, it wakes at most the waiters of a key that is free,
-- which is what waking them is for. Always true (the `released` column).
CREATE FUNCTION lease._fast_wake(key_hash bytea)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM lease.leases AS l
                WHERE l.key_hash = _fast_wake.key_hash AND l.owner IS NULL) THEN
        PERFORM lease._on_release(_fast_wake.key_hash);
    END IF;
    RETURN true;
END;
$$;

-- lease.acquire's common path: a FREE or LAPSED key's row, that nobody has
-- locked, granted to a new owner on a server whose lineage row is current.
-- `g` and `c` are lease.acquire's: the generation lease._generation would
-- compute without writing, and the row locked FOR UPDATE SKIP LOCKED. The
-- row is then updated by the tuple id `c` locked (a TID scan): no second
-- index look-up and digest, and no re-check of a version the statement's
-- snapshot read before the lock (measured: 36.0 against 32.0 µs of server
-- CPU per grant, docs/PERFORMANCE.md). Should `c` lock a version newer
-- than that snapshot (a change committed in between), the TID scan does
-- not see it and the statement gives no row; lease.acquire then decides
-- under the lock `c` keeps. The owner and ttl checks only read the
-- statement's parameters, so they are decided once before any row is
-- read.
CREATE VIEW lease.fast_acquire AS
    SELECT NULL::text AS key, NULL::text AS owner, NULL::interval AS ttl,
           NULL::bigint AS epoch, NULL::timestamptz AS expires_at;

CREATE RULE grant_free_key AS ON UPDATE TO lease.fast_acquire DO INSTEAD
    UPDATE lease.leases AS l
       SET owner = NEW.owner,
           epoch = GREATEST(l.epoch + 1, (g.generation << 40) + 1),
           expires_at = clock_timestamp() + NEW.ttl,
           lapsed_owner = l.owner
      FROM (SELECT GREATEST(lg.base + lg.last_timeline - 1, lg.external_floor) AS generation
              FROM lease.lineage AS lg
             WHERE lg.singleton
               AND lg.checked_start = pg_postmaster_start_time()
               AND lg.last_timeline = CASE
                       WHEN pg_is_in_recovery() THEN (pg_control_checkpoint()).timeline_id::bigint
                       ELSE ('x' || substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8))::bit(32)::bigint
                   END) AS g,
           (SELECT lc.ctid
              FROM lease.leases AS lc
             WHERE lc.key_hash = sha256(convert_to(NEW.key, 'UTF8')) AND lc.key = NEW.key
               AND (lc.owner IS NULL OR lc.expires_at <= clock_timestamp())
               AND lc.group_id IS NULL
               FOR UPDATE SKIP LOCKED) AS c
     WHERE l.ctid = c.ctid
       AND NEW.owner <> '' AND octet_length(NEW.owner) <= 16384
       AND NEW.ttl > interval '0' AND NEW.ttl <= interval '100 years'
       AND date_part('day', NEW.ttl) = 0 AND date_part('month', NEW.ttl) = 0
       AND date_part('year', NEW.ttl) = 0
       AND (NOT EXISTS (SELECT FROM lease.namespaces) OR lease._fast_allowed(NEW.key))
       AND (current_setting('synchronous_commit') NOT IN ('off', 'local')
            OR set_config('synchronous_commit', 'on', true) = 'on')
    RETURNING NEW.key, NEW.owner, NEW.ttl, l.epoch, l.expires_at;

-- lease.renew's common path: the live grant (key, owner, epoch) extended
-- to now + ttl.
CREATE VIEW lease.fast_renew AS
    SELECT NULL::text AS key, NULL::text AS owner, NULL::bigint AS epoch,
           NULL::interval AS ttl, NULL::timestamptz AS expires_at;

CREATE RULE renew_live_grant AS ON UPDATE TO lease.fast_renew DO INSTEAD
    UPDATE lease.leases AS l
       SET expires_at = clock_timestamp() + NEW.ttl
     WHERE l.key_hash = sha256(convert_to(NEW.key, 'UTF8')) AND l.key = NEW.key
       AND l.owner = NEW.owner AND l.epoch = NEW.epoch
       AND l.expires_at > clock_timestamp()
       AND NEW.ttl > interval '0' AND NEW.ttl <= interval '100 years'
       AND date_part('day', NEW.ttl) = 0 AND date_part('month', NEW.ttl) = 0
       AND date_part('year', NEW.ttl) = 0
       AND (NOT EXISTS (SELECT FROM lease.namespaces) OR lease._fast_allowed(NEW.key))
       AND (current_setting('synchronous_commit') NOT IN ('off', 'local')
            OR set_config('synchronous_commit', 'on', true) = 'on')
    RETURNING NEW.key, NEW.owner, NEW.epoch, NEW.ttl, l.expires_at;

-- lease.release's common path: the live grant (key, owner, epoch) ended,
-- the key FREE and its counter one higher. `released` wakes the key's
-- waiters as lease._on_release does: in READ COMMITTED, once this
-- transaction holds the key's waiter lock, a waiters table without pages
-- has no registration to look up; otherwise lease._fast_wake does the
-- look-up (or notifies at once, as lease._on_release decides).
CREATE VIEW lease.fast_release AS
    SELECT NULL::text AS key, NULL::text AS owner, NULL::bigint AS epoch,
           NULL::boolean AS released;

CREATE RULE release_live_grant AS ON UPDATE TO lease.fast_release DO INSTEAD
    UPDATE lease.leases AS l
       SET owner = NULL, expires_at = NULL, lapsed_owner = NULL, epoch = l.epoch + 1
     WHERE l.key_hash = sha256(convert_to(NEW.key, 'UTF8')) AND l.key = NEW.key
       AND l.owner = NEW.owner AND l.epoch = NEW.epoch
       AND l.expires_at > clock_timestamp() AND l.group_id IS NULL
       AND (NOT EXISTS (SELECT FROM lease.namespaces) OR lease._fast_allowed(NEW.key))
       AND (current_setting('synchronous_commit') NOT IN ('off', 'local')
            OR set_config('synchronous_commit', 'on', true) = 'on')
    RETURNING NEW.key, NEW.owner, NEW.epoch,
              CASE WHEN current_setting('transaction_isolation') = 'read committed'
                        AND pg_try_advisory_xact_lock(1818785643,
                                ('x' || encode(substring(l.key_hash FROM 1 FOR 4), 'hex'))::bit(32)::integer)
                        AND pg_relation_size('lease.waiters'::regclass) = 0
                   THEN true
                   ELSE lease._fast_wake(l.key_hash)
              END;

REVOKE ALL ON lease.fast_acquire, lease.fast_renew, lease.fast_release FROM PUBLIC;
GRANT SELECT, UPDATE (key, owner, ttl) ON lease.fast_acquire TO PUBLIC;
GRANT SELECT, UPDATE (key, owner, epoch, ttl) ON lease.fast_renew TO PUBLIC;
GRANT SELECT, UPDATE (key, owner, epoch) ON lease.fast_release TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease._fast_allowed(text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease._fast_wake(bytea) TO PUBLIC;

SELECT pg_catalog.set_config('search_path', pg_catalog.current_setting('leasehold.installer_search_path'), true);
