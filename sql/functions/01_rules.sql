-- leasehold: one definition of every rule (docs/SPECIFICATION.md §1–§4).
-- Every entry point calls these helpers; none restates them. Most are SQL
-- functions the planner inlines into the caller's statement or PL/pgSQL
-- expression, so a rule costs what its expression costs and nothing for the
-- call. Helpers are granted to nobody and pin their search_path (an
-- inlined SQL function cannot carry a SET clause, so those qualify every
-- name instead and use only pg_catalog objects and `lease.` ones).
--
--   rule                         helper
--   ---------------------------  ---------------------------------------
--   a name's digest              lease._key_hash
--   the caps                     lease._max_name_bytes, lease._max_span,
--                                lease._max_generation, lease._max_batch,
--                                lease._waiter_limit
--   a valid name                 lease._name_ok (why not: _text_violations)
--   a valid ttl / wait           lease._ttl_ok / lease._wait_ok, both on
--                                lease._span_effect (why not:
--                                _ttl_violations, _wait_violations)
--   a new expiry                 lease._expires_in
--   liveness                     lease._live (a grant), lease._group_live
--   effective expiry             lease._expiry
--   lapsed long enough to prune  lease._lapsed_for, lease._group_lapsed_for,
--                                both on lease._idle_cutoff
--   the epoch floor              lease._grant_epoch, lease._lineage_generation
--   a grant's end                lease._freed
--   the namespace decision       lease._allowed
--   the waiter lock id           lease._waiter_lock_id
--   durability                   lease._make_durable
--   a transaction that may not   lease._read_only
--   write
--   why a grant does not match   lease._status
--   why its holder lost it       lease._refusal

SET LOCAL lock_timeout = '5s';

-- The digest that indexes a lease key (lease.leases.key_hash) or a guarded
-- resource name (lease.guards.resource_hash): SHA-256 of the UTF-8 bytes.
-- The same expression is the tables' key_hash CHECK. `'UTF8'::name`
-- matches pg_catalog.convert_to(text, name) exactly, so no function a
-- caller created can be a better match. Inlined (STABLE like convert_to).
CREATE OR REPLACE FUNCTION lease._key_hash(key text)
RETURNS bytea
LANGUAGE sql STABLE STRICT PARALLEL SAFE
AS $$ SELECT pg_catalog.sha256(pg_catalog.convert_to(key, 'UTF8'::pg_catalog.name)) $$;

-- The caps (docs/SPECIFICATION.md §1.3, §1.4, §4). Inlined constants.
-- Names (keys, owners, resources) are stored, so their size is capped;
-- the tables' CHECK constraints say the same.
CREATE OR REPLACE FUNCTION lease._max_name_bytes()
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 16384 $$;

-- The longest ttl, wait or idle time.
CREATE OR REPLACE FUNCTION lease._max_span()
RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT interval '100 years' $$;

-- The highest generation: (generation << 40) + 1 and every counter below
-- the next generation stay positive bigints.
CREATE OR REPLACE FUNCTION lease._max_generation()
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 8388607::bigint $$;

-- The most keys one batch call takes: its row locks last until the caller's
-- transaction ends, and a call can carry up to 16 KiB per key.
CREATE OR REPLACE FUNCTION lease._max_batch()
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 1000 $$;

-- How many waiter registrations one session may hold (the Rust client's
-- WAITER_LIMIT).
CREATE OR REPLACE FUNCTION lease._waiter_limit()
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 10000 $$;

-- A valid name: not NULL, not empty, at most lease._max_name_bytes()
-- bytes. Measured in bytes, so no collation takes part.
CREATE OR REPLACE FUNCTION lease._name_ok(value text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT value IS NOT NULL
       AND pg_catalog.octet_length(value) OPERATOR(pg_catalog.>=) 1
       AND pg_catalog.octet_length(value) OPERATOR(pg_catalog.<=) lease._max_name_bytes()
$$;

-- Why a name is not valid, phrased as what the caller must do; empty when
-- lease._name_ok accepts it. The error path only.
CREATE OR REPLACE FUNCTION lease._text_violations(argument text, value text)
RETURNS text[]
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE
        WHEN lease._name_ok(value) THEN ARRAY[]::text[]
        WHEN value IS NULL THEN ARRAY[argument || ' must not be NULL']
        WHEN octet_length(value) = 0 THEN ARRAY[argument || ' must not be empty']
        ELSE ARRAY[argument || ' must be at most ' || lease._max_name_bytes() || ' bytes']
    END
$$;

-- What a non-NULL span does to the clock now (in the session's time zone,
-- as a grant's own clock_timestamp() + ttl does): 'negative', 'zero', 'ok'
-- (at most lease._max_span() ahead), 'over', or 'overflow' when PostgreSQL
-- cannot add it to now at all. THE rule for ttl, wait and idle spans: a
-- span is judged by the time it adds, not by interval ordering, which
-- counts a month as 30 days and a day as 24 hours ('-1 year 361 days'
-- orders above zero yet moves the clock back).
CREATE OR REPLACE FUNCTION lease._span_effect(span interval)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_end timestamptz;
BEGIN
    v_end := v_now + span;
    IF v_end < v_now THEN
        RETURN 'negative';
    ELSIF v_end = v_now THEN
        RETURN 'zero';
    ELSIF v_end > v_now + lease._max_span() THEN
        RETURN 'over';
    END IF;
    RETURN 'ok';
EXCEPTION WHEN datetime_field_overflow OR interval_field_overflow THEN
    RETURN 'overflow';
END;
$$;

-- Whether a span is only a time (no day and no month part): such a span
-- moves the clock by exactly its length, whatever the time zone does, so
-- interval ordering judges it exactly. Truncated to months, a span keeps
-- only its months (zero only without any); truncated to days, its months
-- and days (then zero only without days). tests/leasehold/sql_rules.rs
-- pins it against lease._span_effect. Inlined.
CREATE OR REPLACE FUNCTION lease._time_only(span interval)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT pg_catalog.date_trunc('month', span) OPERATOR(pg_catalog.=) interval '0'
       AND pg_catalog.date_trunc('day', span) OPERATOR(pg_catalog.=) interval '0'
$$;

-- Whether a span is only a time and strictly between `above` and
-- lease._max_span(): for such a span, ordering is exact, so it is the
-- answer lease._span_effect would give, without a PL/pgSQL call. A
-- shortcut that only ever accepts: whatever it does not accept goes to
-- lease._span_effect. tests/leasehold/sql_rules.rs checks that it never
-- accepts what lease._span_effect refuses.
CREATE OR REPLACE FUNCTION lease._plain_span_within(span interval, above interval)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT span OPERATOR(pg_catalog.>) above
       AND span OPERATOR(pg_catalog.<) lease._max_span()
       AND lease._time_only(span)
$$;

-- A valid ttl: not NULL, and it moves the clock forward by at most
-- lease._max_span().
CREATE OR REPLACE FUNCTION lease._ttl_ok(ttl interval)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT CASE
        WHEN ttl IS NULL THEN false
        WHEN lease._plain_span_within(ttl, interval '0') THEN true
        ELSE lease._span_effect(ttl) OPERATOR(pg_catalog.=) 'ok'
    END
$$;

-- A valid wait: not NULL, and it moves the clock forward by zero up to
-- lease._max_span().
CREATE OR REPLACE FUNCTION lease._wait_ok(wait interval)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT CASE
        WHEN wait IS NULL THEN false
        WHEN wait OPERATOR(pg_catalog.=) interval '0' AND lease._time_only(wait) THEN true
        WHEN lease._plain_span_within(wait, interval '0') THEN true
        ELSE lease._span_effect(wait) OPERATOR(pg_catalog.=) ANY (ARRAY['ok', 'zero'])
    END
$$;

-- Why a ttl, wait or idle span is not valid; empty when it is. `argument`
-- names it; `zero_ok` says whether a span that adds nothing is fine (a
-- wait) or not (a ttl, an idle time).
CREATE OR REPLACE FUNCTION lease._span_violations(argument text, span interval, zero_ok boolean)
RETURNS text[]
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE
        WHEN span IS NULL THEN ARRAY[argument || ' must not be NULL']
        ELSE CASE lease._span_effect(span)
            WHEN 'negative' THEN ARRAY[argument || CASE WHEN zero_ok THEN ' must not be negative' ELSE ' must be positive' END]
            WHEN 'zero' THEN CASE WHEN zero_ok THEN ARRAY[]::text[] ELSE ARRAY[argument || ' must be positive'] END
            WHEN 'over' THEN ARRAY[argument || ' must be at most 100 years']
            WHEN 'overflow' THEN ARRAY[argument || ' must not overflow when added to the current time']
            ELSE ARRAY[]::text[]
        END
    END
$$;

CREATE OR REPLACE FUNCTION lease._ttl_violations(ttl interval)
RETURNS text[]
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT lease._span_violations('ttl', ttl, false) $$;

CREATE OR REPLACE FUNCTION lease._wait_violations(wait interval)
RETURNS text[]
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT lease._span_violations('wait', wait, true) $$;

-- An epoch: not NULL and, when `minimum` is given, at least `minimum`
-- (phrased "must not be negative" for a minimum of 0). A NULL minimum means
-- any value is valid input (renew, release and check_held answer a wrong
-- epoch with a status or an error of their own).
CREATE OR REPLACE FUNCTION lease._epoch_violations(argument text, value bigint, minimum bigint)
RETURNS text[]
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE
        WHEN value IS NULL THEN ARRAY[argument || ' must not be NULL']
        WHEN value < minimum AND minimum = 0 THEN ARRAY[argument || ' must not be negative']
        WHEN value < minimum THEN ARRAY[argument || ' must be at least ' || minimum::text]
        ELSE ARRAY[]::text[]
    END
$$;

-- THE DETAIL of every refusal: one JSON object of the name/value pairs
-- given (alternating), each value a JSON string or null. A client of any
-- language reads it with its JSON parser, whatever spaces or '=' a key or
-- owner holds; numbers travel as decimal text, so no client loses a
-- bigint's precision. Inlined.
CREATE OR REPLACE FUNCTION lease._detail(VARIADIC fields text[])
RETURNS text
LANGUAGE sql IMMUTABLE
AS $$ SELECT pg_catalog.json_object(fields)::pg_catalog.text $$;

-- Raises invalid_input (SQLSTATE 22023) naming every violation; the stable
-- machine-readable name travels in the CONSTRAINT field. Returns without
-- raising when there is none.
CREATE OR REPLACE FUNCTION lease._raise_invalid(caller text, violations text[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF cardinality(violations) = 0 THEN
        RETURN;
    END IF;
    RAISE EXCEPTION 'invalid input to lease.%: %', caller, array_to_string(violations, '; ')
        USING ERRCODE = '22023',
              CONSTRAINT = 'lease_invalid_input',
              DETAIL = array_to_string(violations, '; '),
              HINT = 'Pass a non-empty key and owner, a positive ttl, a non-negative wait and a non-NULL epoch.';
END;
$$;

-- Why a lease call refused its arguments, raised in the specification's
-- order (docs/SPECIFICATION.md §1.4, §4.2): every invalid argument
-- (22023), else the key's namespace (42501), else, for a call that
-- `writes`, a read-only transaction (25006). A NULL `epoch`, `ttl` or
-- `wait` argument here means the call takes none. The error path behind
-- each lease call's one test of its input; returns when nothing is wrong.
CREATE OR REPLACE FUNCTION lease._refuse_call(caller text, key text, owner text, epoch bigint,
                                   ttl interval, wait interval, writes boolean)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_takes text[] := lease._call_arguments(caller);
BEGIN
    PERFORM lease._raise_invalid(caller,
        lease._text_violations('key', key)
        || CASE WHEN 'owner' = ANY (v_takes) THEN lease._text_violations('owner', owner) ELSE '{}' END
        || CASE WHEN 'ttl' = ANY (v_takes) THEN lease._ttl_violations(ttl) ELSE '{}' END
        || CASE WHEN 'wait' = ANY (v_takes) THEN lease._wait_violations(wait) ELSE '{}' END
        || CASE WHEN 'epoch' = ANY (v_takes) THEN lease._epoch_violations('epoch', epoch, NULL) ELSE '{}' END);
    IF NOT lease._allowed(key) THEN
        PERFORM lease._raise_forbidden(caller, 'key', key);
    END IF;
    IF writes AND lease._read_only() THEN
        RAISE EXCEPTION 'cannot execute lease.% in a read-only transaction', caller
            USING ERRCODE = '25006';
    END IF;
END;
$$;

-- The arguments each lease call takes besides its key, for
-- lease._refuse_call.
CREATE OR REPLACE FUNCTION lease._call_arguments(caller text)
RETURNS text[]
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE caller
        WHEN 'acquire' THEN ARRAY['owner', 'ttl', 'wait']
        WHEN 'renew' THEN ARRAY['owner', 'ttl', 'epoch']
        WHEN 'release' THEN ARRAY['owner', 'epoch']
        WHEN 'why_refused' THEN ARRAY['owner', 'epoch']
        ELSE ARRAY[]::text[]
    END
$$;

-- The moment `span` after the clock at the call: the expiry of a grant
-- (or group) renewed now for `span`, or a call's deadline. The clock, never
-- the transaction's start (now()), so a call made late in a long
-- transaction still gets its whole ttl or wait.
CREATE OR REPLACE FUNCTION lease._expires_in(span interval)
RETURNS timestamptz
LANGUAGE sql VOLATILE
AS $$ SELECT pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) span $$;

-- Whether a heartbeat group is live: its expiry is ahead of the clock.
CREATE OR REPLACE FUNCTION lease._group_live(g lease.groups)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$ SELECT (g).expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp() $$;

-- The expiry of group `group_id`; NULL when there is no such group (a
-- prune deletes a lapsed group and clears its members in one statement,
-- but a member row read in an older snapshot may still name it).
-- PL/pgSQL: a SQL function with a sub-select is never inlined, and
-- PL/pgSQL keeps its plan for the session.
CREATE OR REPLACE FUNCTION lease._group_expiry(group_id bigint)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT g.expires_at FROM lease.groups AS g WHERE g.id = _group_expiry.group_id);
END;
$$;

-- Whether a grant is live: it has an owner and its own expiry is ahead of
-- the clock, or its heartbeat group's is. Never NULL: a grant has an
-- expiry (leases_grant_complete), and a group that is gone counts as
-- lapsed. THE liveness rule: every "is it live" question calls this.
-- Inlined into every caller; the own expiry is compared first, so a grant
-- outside any group, or one whose own expiry is ahead, never looks at a
-- group.
CREATE OR REPLACE FUNCTION lease._live(l lease.leases)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT (l).owner IS NOT NULL
       AND ((l).expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()
            OR ((l).group_id IS NOT NULL
                AND COALESCE(lease._group_expiry((l).group_id) OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp(), false)))
$$;

-- A grant's effective expiry: its own, or its group's when that is later;
-- NULL for a FREE row. What inspect shows and prune compares.
CREATE OR REPLACE FUNCTION lease._expiry(l lease.leases)
RETURNS timestamptz
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN (l).group_id IS NULL THEN (l).expires_at
                ELSE GREATEST((l).expires_at, lease._group_expiry((l).group_id)) END
$$;

-- Pruning's idle test: a time at or before this, `idle` before the clock
-- at the call, is idle long enough. Takes a span, not a time, so that no
-- function of the schema takes a time from its caller
-- (docs/SPECIFICATION.md §1.1). Every idle test of pruning (a lapsed
-- grant, a lapsed group, a FREE key's sighting, a guard record's last
-- update) compares with this.
CREATE OR REPLACE FUNCTION lease._idle_cutoff(idle interval)
RETURNS timestamptz
LANGUAGE sql VOLATILE
AS $$ SELECT pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) idle $$;

-- Whether a grant has been lapsed for at least `idle` by the clock: it has
-- an owner and its effective expiry is at least `idle` ago.
CREATE OR REPLACE FUNCTION lease._lapsed_for(l lease.leases, idle interval)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT (l).owner IS NOT NULL
       AND lease._expiry(l) OPERATOR(pg_catalog.<=) lease._idle_cutoff(idle)
$$;

-- Whether a heartbeat group has been lapsed for at least `idle`.
CREATE OR REPLACE FUNCTION lease._group_lapsed_for(g lease.groups, idle interval)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$ SELECT (g).expires_at OPERATOR(pg_catalog.<=) lease._idle_cutoff(idle) $$;

-- THE end of a grant (docs/SPECIFICATION.md §1.3): the row a release or a
-- force-release leaves, FREE with its counter one above the grant's epoch,
-- so that epoch and every lower one are stale. `forced` is what
-- force_released records: true for an operator's force-release, NULL for
-- the holder's release. Every function that frees a row writes the whole
-- row with it, `SET (key, key_hash, owner, epoch, expires_at, lapsed_owner,
-- first_epoch, group_id, force_released) = ROW((lease._freed(l, ...)).*)`,
-- the table's columns in order, so a new column fails every such UPDATE
-- until this rule says what freeing does to it. Inlined: the planner
-- reduces the assignment to one expression per column, the unchanged ones
-- to the old values, so it costs about what the written-out SET list cost
-- (3,000 to 4,000 instructions more per freeing UPDATE, for the columns
-- kept; benches/levers/instructions.sh -r), and an unchanged key keeps the
-- UPDATE a no-key, HOT one (PostgreSQL compares the values).
CREATE OR REPLACE FUNCTION lease._freed(l lease.leases, forced boolean)
RETURNS lease.leases
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT ROW((l).key, (l).key_hash, NULL, (l).epoch OPERATOR(pg_catalog.+) 1, NULL, NULL,
               (l).first_epoch, NULL, forced)::lease.leases
$$;

-- Counts grants out of their groups (lease.groups.members), one entry per
-- grant that left, in the transaction that cleared their group_id. NULL
-- entries (grants in no group) and groups already gone count nothing.
CREATE OR REPLACE FUNCTION lease._left_groups(group_ids bigint[])
RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE lease.groups AS g
       SET members = g.members - c.n
      FROM (SELECT x.id, count(*)::integer AS n FROM unnest(_left_groups.group_ids) AS x(id) GROUP BY x.id) AS c
     WHERE g.id = c.id
$$;

-- Whether this transaction may not write (a standby, a primary being
-- demoted with default_transaction_read_only, a READ ONLY transaction):
-- the one read-only test of the functions. Inlined.
CREATE OR REPLACE FUNCTION lease._read_only()
RETURNS boolean
LANGUAGE sql STABLE
AS $$ SELECT pg_catalog.current_setting('transaction_read_only')::pg_catalog.bool $$;

-- §1.4: whatever the session asked for, a write of leasehold's is durable
-- at commit. Raises synchronous_commit to `on` for this transaction, and
-- only from below `on`; remote_write and remote_apply stay. Every function
-- that writes calls it after its write. Inlined.
CREATE OR REPLACE FUNCTION lease._make_durable()
RETURNS text
LANGUAGE sql VOLATILE
AS $$
    SELECT CASE WHEN pg_catalog.current_setting('synchronous_commit') OPERATOR(pg_catalog.=) ANY (ARRAY['off', 'local'])
                THEN pg_catalog.set_config('synchronous_commit', 'on', true) END
$$;

-- The server's timeline, without lag: the first 8 hex digits of the WAL file
-- name of the current insert position, which takes the new timeline at the
-- moment of a promotion. During recovery (a standby) there is no insert
-- position; the timeline of the last checkpoint or restartpoint is the best
-- a standby knows. Inlined by the planner (no sub-select).
CREATE OR REPLACE FUNCTION lease._timeline()
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
    SELECT CASE WHEN pg_catalog.pg_is_in_recovery()
                THEN (pg_catalog.pg_control_checkpoint()).timeline_id::bigint
                ELSE ('x' OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_insert_lsn()), 1, 8))::bit(32)::bigint
           END
$$;

-- The lineage row while it is current: checked by this server since it
-- started, on the timeline it runs on, so there is nothing newer to
-- record (see lease.lineage). The common grants take their generation
-- from it; every other grant records the lineage first
-- (lease._generation). Inlined into the statement that reads it.
CREATE OR REPLACE FUNCTION lease._current_lineage()
RETURNS SETOF lease.lineage
LANGUAGE sql STABLE
AS $$
    SELECT lg.* FROM lease.lineage AS lg
     WHERE lg.singleton
       AND lg.checked_start OPERATOR(pg_catalog.=) pg_catalog.pg_postmaster_start_time()
       AND lg.last_timeline OPERATOR(pg_catalog.=) lease._timeline()
$$;

-- The generation a lineage row gives on `timeline` (see lease.lineage).
-- last_timeline is never above the timeline in its own lineage, but the
-- GREATEST keeps the generation from going back should it ever be.
CREATE OR REPLACE FUNCTION lease._lineage_generation(g lease.lineage, timeline bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE
AS $$
    SELECT GREATEST((g).base OPERATOR(pg_catalog.+) GREATEST(timeline, (g).last_timeline) OPERATOR(pg_catalog.-) 1,
                    (g).external_floor)
$$;

-- THE epoch floor: the epoch of a grant whose key's counter is `counter`
-- (NULL for a key without a row: never seen, or pruned), in generation
-- `generation`, with the prune watermark `pruned_through`. Above the
-- counter (I3), at least the generation's first epoch (§1.2), and for a
-- key without a row above every epoch a pruned key had (§1.8).
CREATE OR REPLACE FUNCTION lease._grant_epoch(counter bigint, generation bigint, pruned_through bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE
AS $$
    SELECT GREATEST(COALESCE(counter, pruned_through) OPERATOR(pg_catalog.+) 1,
                    (generation OPERATOR(pg_catalog.<<) 40) OPERATOR(pg_catalog.+) 1)
$$;

-- The current generation (see lease.lineage).
--
-- With `write_row` (a grant, or lease.raise_generation), the call keeps the
-- row up to date: a timeline above last_timeline, or this server's start
-- time, is recorded, and a system identifier other than the row's starts a
-- new lineage. Recording never waits (SKIP LOCKED): the generation does not
-- depend on it. A new lineage must be written exactly once, so the row is
-- locked for it (within the caller's lock_timeout), then read again:
-- another grant may have started the lineage already.
--
-- Without `write_row` (lease.generation, which a standby can call) nothing
-- is written or locked; on a new system identifier it reports the
-- generation the next grant will start.
CREATE OR REPLACE FUNCTION lease._generation(write_row boolean)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_row lease.lineage;
    v_sysid bigint := (pg_control_system()).system_identifier;
    v_start timestamptz := pg_postmaster_start_time();
    v_timeline bigint := lease._timeline();
    v_generation bigint;
BEGIN
    SELECT g.* INTO v_row FROM lease.lineage AS g WHERE g.singleton;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'leasehold''s lineage row is missing from lease.lineage'
            USING ERRCODE = 'XX000',
                  HINT = 'The table is written only by leasehold''s install; restore it from a backup of this database.';
    END IF;
    IF v_row.system_identifier <> v_sysid AND write_row THEN
        SELECT g.* INTO v_row FROM lease.lineage AS g WHERE g.singleton FOR NO KEY UPDATE;
    END IF;
    IF v_row.system_identifier = v_sysid THEN
        v_generation := lease._lineage_generation(v_row, v_timeline);
        IF write_row AND (v_timeline > v_row.last_timeline
                          OR v_row.checked_start IS DISTINCT FROM v_start) THEN
            PERFORM 1 FROM lease.lineage AS g
             WHERE g.singleton AND g.system_identifier = v_sysid
               AND (g.last_timeline < v_timeline OR g.checked_start IS DISTINCT FROM v_start)
               FOR NO KEY UPDATE SKIP LOCKED;
            IF FOUND THEN
                UPDATE lease.lineage AS g
                   SET last_timeline = GREATEST(g.last_timeline, v_timeline),
                       checked_start = v_start
                 WHERE g.singleton;
            END IF;
        END IF;
        RETURN v_generation;
    END IF;
    -- A new lineage (a dump restored into another cluster): one above every
    -- generation the old lineage recorded in this row or used in a counter,
    -- pruned counters included (the watermark).
    v_generation := GREATEST(lease._lineage_generation(v_row, v_row.last_timeline),
                             (SELECT max(l.epoch) >> 40 FROM lease.leases AS l),
                             v_row.pruned_through >> 40) + 1;
    IF write_row THEN
        UPDATE lease.lineage AS g
           SET system_identifier = v_sysid,
               base = v_generation + 1 - v_timeline,
               last_timeline = v_timeline,
               checked_start = v_start
         WHERE g.singleton;
        -- The namespace rules the dump brought follow their role's name
        -- until now (lease._rule_role); from here on each is held by the
        -- oid that name has in this cluster, so a role dropped and created
        -- again here fails closed as it would have where it was bound. The
        -- same role is admitted before and after, so the rules' change
        -- marker (lease.namespace_changes) is left alone. A rule whose
        -- role does not exist here keeps following the name.
        UPDATE lease.namespaces AS n
           SET role_oid = r.oid,
               system_identifier = v_sysid
          FROM pg_catalog.pg_roles AS r
         WHERE n.system_identifier <> v_sysid
           AND r.rolname::text COLLATE "C" = n.role_name;
    END IF;
    RETURN v_generation;
END;
$$;

-- The role a namespace rule admits (see lease.namespaces), or 0, which no
-- role is a member of, so the rule fails closed. The common case, the
-- role with the recorded oid still has the recorded name, reads pg_roles
-- once and not the control file. Otherwise, in the cluster that recorded
-- the oid, the role was renamed or dropped: 0. In another cluster the
-- oid means nothing and the name decides, so a role that happens to have
-- the old oid there gains nothing. PL/pgSQL: it reads pg_authid.
CREATE OR REPLACE FUNCTION lease._rule_role(rule lease.namespaces)
RETURNS oid
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_role oid;
BEGIN
    IF (SELECT r.rolname::text COLLATE "C" FROM pg_catalog.pg_roles AS r WHERE r.oid = (rule).role_oid)
       IS NOT DISTINCT FROM (rule).role_name THEN
        RETURN (rule).role_oid;
    END IF;
    IF (rule).system_identifier = (pg_catalog.pg_control_system()).system_identifier THEN
        RETURN 0;
    END IF;
    SELECT r.oid INTO v_role FROM pg_catalog.pg_roles AS r WHERE r.rolname::text COLLATE "C" = (rule).role_name;
    RETURN COALESCE(v_role, 0);
END;
$$;

-- Whether this backend runs code its login role never sent, so that
-- code any table owner wrote would borrow that role's rights: an
-- autovacuum worker, which evaluates the index expressions of the tables
-- it analyzes as each table's owner while session_user is the bootstrap
-- superuser (its activity entry has no user: userid 0), and a logical
-- replication worker, which fires the triggers of the tables it applies
-- to under session_replication_role = replica (a setting only a superuser
-- can make). Such a backend acts on no governed name and lists no key.
-- The entry is found by pid: its other columns are hidden from a role
-- that is not the session's.
CREATE OR REPLACE FUNCTION lease._borrowed_session()
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN current_setting('session_replication_role') = 'replica'
        OR NOT EXISTS (SELECT 1 FROM pg_stat_get_backend_idset() AS b(id)
                        WHERE pg_stat_get_backend_pid(b.id) = pg_backend_pid()
                          AND pg_stat_get_backend_userid(b.id) <> 0);
END;
$$;

-- Whether the calling session may act on `name`, by the namespace rules
-- that exist (docs/SPECIFICATION.md §4). The caller is session_user, the
-- role that logged in: inside a SECURITY DEFINER function current_user is
-- the function's owner, and an ordinary role cannot change session_user
-- (SET ROLE changes current_user only). Membership counts as
-- pg_has_role(..., 'MEMBER') reports it; a rule whose role was dropped
-- admits nobody but superusers. A backend that runs code its login role
-- never sent (lease._borrowed_session) is admitted by no rule.
--
-- Old snapshots. The rules are read with the statement's snapshot. Under
-- READ COMMITTED that snapshot is taken at the call, so the call sees
-- every change committed before it. Under REPEATABLE READ or SERIALIZABLE
-- it is the transaction's, which may predate a change; so there the call
-- first locks lease.namespace_changes FOR SHARE, which every change
-- writes: a change committed after the snapshot makes the lock fail with
-- a serialization failure (40001, retry the transaction), and a change in
-- progress is waited for. A read-only transaction cannot lock; its calls
-- (inspect) read as of its snapshot, rules and rows alike.
CREATE OR REPLACE FUNCTION lease._allowed_by_rules(name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_role oid;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed'
       AND NOT lease._read_only() THEN
        BEGIN
            PERFORM 1 FROM lease.namespace_changes AS c WHERE c.singleton FOR SHARE;
        EXCEPTION WHEN serialization_failure THEN
            RAISE EXCEPTION 'the namespace rules changed after this transaction''s snapshot was taken'
                USING ERRCODE = '40001',
                      CONSTRAINT = 'lease_namespace_changed',
                      HINT = 'Retry the transaction: a new snapshot sees the rules as they are now.';
        END;
    END IF;
    SELECT lease._rule_role(n) INTO v_role
      FROM lease.namespaces AS n
     WHERE starts_with(_allowed_by_rules.name COLLATE "C", n.prefix)
     ORDER BY octet_length(n.prefix) DESC
     LIMIT 1;
    IF NOT FOUND THEN
        RETURN true;
    END IF;
    -- A rule whose role cannot be matched (v_role 0) admits superusers only.
    RETURN COALESCE(pg_has_role(session_user, v_role, 'MEMBER'), false) AND NOT lease._borrowed_session();
END;
$$;

-- Whether any namespace rule may exist: while lease.namespaces has no
-- pages it has no rows, committed or not, so no rule exists and none is
-- being written. A file size read (about 1.5 µs) instead of a query; a
-- table that once had rules keeps its pages, and so answers true, until
-- VACUUM truncates them (the size is read under the table's ACCESS SHARE
-- lock, which that truncation conflicts with). Inlined (no sub-select);
-- VOLATILE because pg_relation_size is.
CREATE OR REPLACE FUNCTION lease._any_rules()
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT pg_catalog.pg_relation_size('lease.namespaces'::pg_catalog.regclass) OPERATOR(pg_catalog.<>) 0
$$;

-- THE namespace decision: whether the calling session may act on `name`.
-- Inlined; the rules are looked up only when some may exist.
CREATE OR REPLACE FUNCTION lease._allowed(name text)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT NOT lease._any_rules() OR lease._allowed_by_rules(name)
$$;

-- Raised when the caller may not act on `name` (docs/SPECIFICATION.md §4).
-- Names the caller's own argument and role, never the rule's role or
-- anything about the key's state.
CREATE OR REPLACE FUNCTION lease._raise_forbidden(caller text, argument text, name text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'permission denied for lease.%: role % may not act on % %', caller, session_user, argument, name
        USING ERRCODE = '42501',
              CONSTRAINT = 'lease_namespace_denied',
              DETAIL = lease._detail(argument, name, 'role', session_user::text),
              HINT = 'An operator bound this name''s prefix to another role; connect as a member of that role.';
END;
$$;

-- Why a renew, release or lease check for (key, owner, epoch) did not apply,
-- read from the key's row as committed now (a fresh snapshot, no lock: a
-- caller that is refused keeps nothing). Precedence as in
-- docs/SPECIFICATION.md §1.3: not_owner, then lapsed, then epoch_mismatch.
-- Returns 'ok' when the row does match after all (a change committed after
-- the caller's write looked); the caller then tries its write once more.
CREATE OR REPLACE FUNCTION lease._status(key_hash bytea, key text, owner text, epoch bigint)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_row record;
BEGIN
    SELECT l.owner, l.epoch, l.lapsed_owner, lease._live(l) AS live INTO v_row
      FROM lease.leases AS l
     WHERE l.key_hash = _status.key_hash AND l.key = _status.key COLLATE "C";
    IF NOT FOUND OR v_row.owner IS NULL THEN
        RETURN 'not_owner';
    END IF;
    IF v_row.owner <> _status.owner COLLATE "C" THEN
        IF v_row.lapsed_owner = _status.owner COLLATE "C" THEN
            RETURN 'lapsed';
        END IF;
        RETURN 'not_owner';
    END IF;
    IF NOT v_row.live THEN
        RETURN 'lapsed';
    END IF;
    IF v_row.epoch <> _status.epoch THEN
        RETURN 'epoch_mismatch';
    END IF;
    RETURN 'ok';
END;
$$;

-- Why its holder lost the grant (key, owner, epoch), in the words the Rust
-- refusal and the CLI use (docs/guide/operations.md, "Words"): `status` is
-- lease._status's answer, and `reason` refines it without contradicting it:
--
--   status          reason          when
--   ok              held            the grant is live (nothing was lost)
--   lapsed          lapsed          its ttl passed; newest_epoch is the
--                                   successor's when the key was taken
--   epoch_mismatch  epoch_mismatch  the owner holds the key under
--                                   newest_epoch
--   not_owner       released        the key is FREE right after this grant:
--                   force_released  its holder, or an operator
--                                   (lease.force_release), ended it
--                   superseded      a later grant exists (newest_epoch)
--                   never_held      no grant at or after this epoch (or
--                                   another owner's grant at it)
--
-- newest_epoch is the key's newest grant: the held or lapsed one, or the
-- one a FREE row's counter follows; NULL without a row. Reads the row
-- after lease._status did: a change committed in between can only make the
-- reason later (released, then superseded), never another status's.
CREATE OR REPLACE FUNCTION lease._refusal(key_hash bytea, key text, owner text, epoch bigint,
                               OUT status text, OUT reason text, OUT newest_epoch bigint)
RETURNS record
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_row record;
BEGIN
    status := lease._status(_refusal.key_hash, _refusal.key, _refusal.owner, _refusal.epoch);
    SELECT l.owner IS NULL AS free, l.epoch, l.force_released INTO v_row
      FROM lease.leases AS l
     WHERE l.key_hash = _refusal.key_hash AND l.key = _refusal.key COLLATE "C";
    IF FOUND THEN
        newest_epoch := CASE WHEN v_row.free THEN v_row.epoch - 1 ELSE v_row.epoch END;
    END IF;
    reason := CASE
        WHEN status = 'ok' THEN 'held'
        WHEN status <> 'not_owner' THEN status
        WHEN v_row.free AND newest_epoch = _refusal.epoch THEN
            CASE WHEN v_row.force_released THEN 'force_released' ELSE 'released' END
        WHEN newest_epoch > _refusal.epoch THEN 'superseded'
        ELSE 'never_held' END;
END;
$$;

-- Raised when a call could not settle the state of a key in its fixed
-- number of steps: a change committed under it twice (SQLSTATE 40001,
-- lease_contention; retry the call).
CREATE OR REPLACE FUNCTION lease._raise_contention(caller text, key text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'lease.% could not settle the state of key %: it changed under the call', caller, key
        USING ERRCODE = '40001', CONSTRAINT = 'lease_contention', HINT = 'Retry the call.';
END;
$$;

-- The per-key advisory lock of the waiting protocol (sql/functions/04_waiting.sql),
-- two-int form: a fixed class id (0x6c68776b, "lhwk") and the first four
-- bytes of the key's digest. Different keys may share an id; that only
-- makes a release notify conservatively or a registration retry. Inlined.
CREATE OR REPLACE FUNCTION lease._waiter_class()
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 1818785643 $$;

CREATE OR REPLACE FUNCTION lease._waiter_lock_id(key_hash bytea)
RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
    SELECT ('x' OPERATOR(pg_catalog.||) pg_catalog.encode(pg_catalog.substring(key_hash, 1, 4), 'hex'))::bit(32)::integer
$$;

-- Notifies the listeners of a key that changed hands, on `channel`
-- (lease_released: it became FREE; lease_granted: a new term began), the
-- digest in hex: always, or with `only_if_waiting` only when a
-- registration for the key is visible to a snapshot taken now. Called by
-- lease._on_change alone.
CREATE OR REPLACE FUNCTION lease._notify_change(key_hash bytea, channel text, only_if_waiting boolean)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF only_if_waiting
       AND NOT EXISTS (SELECT 1 FROM lease.waiters AS w WHERE w.key_hash = _notify_change.key_hash) THEN
        RETURN false;
    END IF;
    PERFORM pg_notify(channel, encode(_notify_change.key_hash, 'hex'));
    RETURN true;
END;
$$;

-- The wake-up after a key changed hands (the waiting protocol, see
-- 04_waiting.sql for why no change is missed): every function that frees
-- a key calls it with lease_released, and acquire with lease_granted when
-- it grants a new term, in the changing transaction, after its write; it
-- learns whether it notified (lease._notify_change, above). In this
-- order: the try-lock; when it fails (a registration is in flight),
-- notify. Then, while lease.waiters has no pages it has no row, committed
-- or not, so there is nobody to wake (whatever the snapshot). Then the
-- look-up, which must take its snapshot after the lock is held: under
-- REPEATABLE READ or SERIALIZABLE it would read the transaction's older
-- snapshot, so there it notifies unconditionally. Inlined (a CASE
-- evaluates its branches in order), so a change with nobody registered
-- runs no statement for it and never reads the isolation level.
CREATE OR REPLACE FUNCTION lease._on_change(key_hash bytea, channel text)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT CASE
        WHEN NOT pg_catalog.pg_try_advisory_xact_lock(lease._waiter_class(), lease._waiter_lock_id(key_hash))
            THEN lease._notify_change(key_hash, channel, false)
        WHEN pg_catalog.pg_relation_size('lease.waiters'::pg_catalog.regclass) OPERATOR(pg_catalog.=) 0
            THEN false
        WHEN pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed'
            THEN lease._notify_change(key_hash, channel, false)
        ELSE lease._notify_change(key_hash, channel, true)
    END
$$;

-- Helpers are granted to nobody: they run inside the entry points only.
DO $$
DECLARE
    v_fn pg_catalog.regprocedure;
BEGIN
    FOR v_fn IN SELECT p.oid::pg_catalog.regprocedure FROM pg_catalog.pg_proc AS p
                 WHERE p.pronamespace OPERATOR(pg_catalog.=) 'lease'::pg_catalog.regnamespace LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', v_fn);
    END LOOP;
END
$$;

-- Every file of functions and every migration ends so (see
-- lease._drop_default_grants).
SELECT lease._drop_default_grants();
