-- leasehold: the lease primitive, schema `lease` (docs/SPECIFICATION.md §1).
--
-- The rules every leasehold migration follows:
--
-- * Security. API functions are granted to PUBLIC, SECURITY DEFINER, and
--   pin `SET search_path = pg_catalog, pg_temp`: pg_catalog first, so the
--   built-ins they call unqualified cannot be shadowed by a caller's objects,
--   and pg_temp named last (left out, PostgreSQL would search it first).
--   Leasehold's own objects are always written `lease.`-qualified: an
--   unqualified table name would fall through to pg_temp, where any caller can
--   create a table. Tables are REVOKEd from PUBLIC; the functions are their
--   only writers.
-- * Internal helpers (names starting with `_`) are REVOKEd from PUBLIC and run
--   only inside the API functions, whose pinned search_path they inherit. They
--   carry no SET clause: a SET clause costs a GUC save and restore on every
--   call. The waiting protocol (2026-11-30-000003) documents the only
--   exceptions.
-- * Names, not positions. Parameters are used by name. In a statement that
--   reads or writes a table every column carries its table's alias (`l.key`)
--   and every parameter its function's name (`acquire.key`), so neither can
--   be mistaken for the other. Local variables start with `v_`.
-- * Hot paths first. A call's common path is one row-level write statement (a
--   conditional UPDATE, or an INSERT for a never-seen key) after an inline
--   input check. The list of input violations, and the reason a write did not
--   apply, are computed only on those error paths.

-- docs/SPECIFICATION.md §4: PostgreSQL 14 or newer (the versions the test
-- matrix runs; README, "Supported PostgreSQL versions"). Checked first, so an
-- older server gets nothing; leasehold::install runs the same check before
-- its own bookkeeping (src/install.rs).
DO $$
BEGIN
    IF pg_catalog.current_setting('server_version_num')::pg_catalog.int4 OPERATOR(pg_catalog.<) 140000 THEN
        RAISE EXCEPTION 'leasehold needs PostgreSQL 14 or newer; this server is PostgreSQL %', pg_catalog.current_setting('server_version')
            USING ERRCODE = '0A000',
                  CONSTRAINT = 'lease_unsupported_version',
                  DETAIL = 'minimum=14 server_version=' OPERATOR(pg_catalog.||) pg_catalog.current_setting('server_version'),
                  HINT = 'Upgrade the server to PostgreSQL 14 or newer; nothing was installed.';
    END IF;
END
$$;

CREATE SCHEMA IF NOT EXISTS lease;
-- docs/SPECIFICATION.md §4: never adopt a schema `lease` that another role
-- created. Its owner could replace any function in it, an internal helper
-- included, and the next SECURITY DEFINER call would run that code as the
-- installer. The check follows the CREATE, so a schema created concurrently
-- is judged too; refusing rolls the whole migration back. leasehold::install
-- runs the same check before its own bookkeeping (src/install.rs).
DO $$
DECLARE
    v_owner text;
BEGIN
    SELECT pg_catalog.pg_get_userbyid(n.nspowner) INTO v_owner
      FROM pg_catalog.pg_namespace AS n
     WHERE n.nspname OPERATOR(pg_catalog.=) 'lease'
       AND n.nspowner OPERATOR(pg_catalog.<>)
           (SELECT r.oid FROM pg_catalog.pg_roles AS r WHERE r.rolname OPERATOR(pg_catalog.=) current_user);
    IF v_owner IS NOT NULL THEN
        RAISE EXCEPTION 'schema lease already exists and is owned by role %, not by the installing role %', v_owner, current_user
            USING ERRCODE = '42501',
                  CONSTRAINT = 'lease_schema_not_owned',
                  DETAIL = 'owner=' OPERATOR(pg_catalog.||) v_owner,
                  HINT = 'The owner of schema lease could replace leasehold''s functions. Have that role or a superuser drop the schema, or install as that role.';
    END IF;
END
$$;
REVOKE ALL ON SCHEMA lease FROM PUBLIC;
GRANT USAGE ON SCHEMA lease TO PUBLIC;

-- The digest that indexes a lease key (lease.leases.key_hash) or a guarded
-- resource name (lease.guards.resource_hash). STABLE, like convert_to, so the
-- planner inlines it into every caller: an IMMUTABLE SQL function whose body
-- calls a STABLE one is never inlined and would cost a SQL-function call each
-- time. The digest of a name never changes: a database's encoding is fixed.
CREATE FUNCTION lease._key_hash(key text)
RETURNS bytea
LANGUAGE sql STABLE STRICT PARALLEL SAFE
AS $$ SELECT sha256(convert_to(key, 'UTF8')) $$;

-- One row per key ever leased.
--   owner/expires_at: the current or last grant; both NULL when FREE (released).
--   epoch: the key's fencing counter. It equals the current grant's epoch while
--          a grant exists (held or lapsed) and is one higher after a release.
--   lapsed_owner: when the current grant took over a grant that had lapsed,
--          that grant's owner, so it hears `lapsed` (docs/SPECIFICATION.md
--          §1.3, rule 2).
--   key_hash: lease._key_hash(key), the primary key. A btree entry is limited
--          to about 2.7 kB, so indexing the key itself would refuse long keys;
--          the digest keeps any key length working at a fixed index width.
--          Lookups compare the digest and then the key. A plain column set by
--          the functions, not a generated one: each call computes the digest
--          once, and no UPDATE recomputes it.
--   first_epoch: the epoch of the row's first grant, set by the INSERT of a
--          never-seen key and never changed. A key whose row was pruned
--          (2026-11-30-000005) comes back with a first grant above every
--          epoch it had; guards refuse epochs below first_epoch, which
--          belong to a pruned incarnation (docs/SPECIFICATION.md §1.8, I16). NULL
--          only on rows written before the column existed.
--   group_id: the heartbeat group (lease.groups) the current grant was
--          joined to, or NULL. Set only while a grant exists; every
--          release and takeover clears it.
CREATE TABLE lease.leases (
    key          text        NOT NULL,
    key_hash     bytea       PRIMARY KEY,
    owner        text,
    epoch        bigint      NOT NULL,
    expires_at   timestamptz,
    lapsed_owner text,
    first_epoch  bigint,
    group_id     bigint
);
-- Invariants kept by the functions: epoch >= 1, and owner and expires_at are
-- both NULL or both set. They are not CHECK constraints because PostgreSQL
-- re-reads and re-plans a table's CHECK expressions on every UPDATE, which
-- measurably slows every call.
REVOKE ALL ON TABLE lease.leases FROM PUBLIC;

-- Heartbeat groups (docs/SPECIFICATION.md §1.9): one owner's grants that
-- one row keeps alive, so that a worker holding a thousand keys writes one
-- row per heartbeat instead of a thousand (lease.join_group and
-- lease.renew_group, 2026-11-30-000006). A grant in a group is live until
-- the later of its own expires_at and its group's (lease._expiry).
--   owner: the owner of every member; only that owner renews the group.
--   expires_at: extended by lease.renew_group while it is in the future;
--          once passed it never moves again, so a lapsed group stays
--          lapsed.
--   members: how many grants still name the group. Every call that takes a
--          key out of a group (a release, a takeover, a force-release, a
--          move to another group) lowers it in the same transaction, so a
--          heartbeat that answers with the number it expects knows that no
--          member was lost; the row write also orders a takeover against a
--          heartbeat in flight (lease.acquire).
--   id: drawn at random by lease.join_group (64 bits of a
--          gen_random_uuid(), tried again on a collision), not from a
--          sequence: a sequence's position is not part of an extension's
--          dump, so after a restore it would hand out ids already in use.
CREATE TABLE lease.groups (
    id         bigint      PRIMARY KEY,
    owner      text        NOT NULL,
    expires_at timestamptz NOT NULL,
    members    integer     NOT NULL
);
REVOKE ALL ON TABLE lease.groups FROM PUBLIC;
-- A group's members, for the namespace check of a heartbeat
-- (lease.renew_group). Partial: grants outside groups add no entry, and a
-- renew, which changes no group_id, stays a HOT update.
CREATE INDEX leases_group_id ON lease.leases (group_id) WHERE group_id IS NOT NULL;

-- The expiry of a group, NULL when the group is gone (pruned). PL/pgSQL:
-- a SQL function with a sub-select is never inlined (see
-- lease._allowed_by_rules).
CREATE FUNCTION lease._group_expiry(group_id bigint)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN (SELECT g.expires_at FROM lease.groups AS g WHERE g.id = _group_expiry.group_id);
END;
$$;

-- A grant's effective expiry: its own, or its group's when that is later.
-- Takes the row, not a timestamp, so that no function of the schema takes a
-- time from its caller (docs/SPECIFICATION.md §1.1). Inlined into every
-- caller, where the planner reduces the row's fields to plain columns; a
-- grant outside any group costs one NULL test.
CREATE FUNCTION lease._expiry(l lease.leases)
RETURNS timestamptz
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN (l).group_id IS NULL THEN (l).expires_at
                ELSE GREATEST((l).expires_at, lease._group_expiry((l).group_id)) END
$$;

-- Whether a grant is live now: its own expiry is ahead, or its group's is.
-- The form every "is it live" check uses: the own expiry is compared
-- first, so a grant outside any group, or one whose own expiry is ahead,
-- never looks at a group. Inlined; VOLATILE because it reads the clock.
CREATE FUNCTION lease._live(l lease.leases)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT (l).expires_at > clock_timestamp()
        OR ((l).group_id IS NOT NULL AND lease._group_expiry((l).group_id) > clock_timestamp())
$$;

-- Counts grants out of their groups (lease.groups.members), one entry per
-- grant that left, in the transaction that cleared their group_id. NULL
-- entries (grants in no group) and groups already pruned count nothing.
CREATE FUNCTION lease._left_groups(group_ids bigint[])
RETURNS void
LANGUAGE sql VOLATILE
AS $$
    UPDATE lease.groups AS g
       SET members = g.members - c.n
      FROM (SELECT x.id, count(*)::integer AS n FROM unnest(_left_groups.group_ids) AS x(id) GROUP BY x.id) AS c
     WHERE g.id = c.id
$$;

-- Key namespaces (docs/SPECIFICATION.md §4): an operator binds a prefix of
-- key and resource names to a database role. A name is governed by the rule
-- with the longest prefix it starts with, and only members of that rule's
-- role (and superusers) may act on it. Without rules every role may act on
-- every name, as the seed's model has it. Rules are written only by the
-- operator functions of 2026-11-30-000004.
--   prefix: not empty, at most 1024 bytes (a btree key).
--   role_oid: the bound role. A rule whose role was dropped admits nobody
--          but superusers: it fails closed.
CREATE TABLE lease.namespaces (
    prefix     text        PRIMARY KEY,
    role_oid   oid         NOT NULL,
    created_at timestamptz NOT NULL
);
REVOKE ALL ON TABLE lease.namespaces FROM PUBLIC;

-- Generations (docs/SPECIFICATION.md §1.2, §1.7): what orders epochs across
-- a promotion, a restore onto a new timeline, and a dump restored into
-- another cluster.
--
-- The problem. A key's counter lives in lease.leases and travels by WAL. A
-- standby that is promoted before it received the old primary's last grants
-- (asynchronous replication, or a synchronous standby that was not the one
-- waited for) has older counters, and would grant again epochs the old
-- primary already handed out: two holders with one epoch, and guards that
-- cannot tell them apart.
--
-- The fix. An epoch carries a generation in its high bits: a grant's epoch
-- is GREATEST(counter + 1, (generation << 40) + 1), and the first grant of a
-- never-seen key is (generation << 40) + 1. A server that was never promoted
-- or restored has generation 0, so its epochs are exactly the counter + 1 of
-- the seed (1, 2, 3, ...). Releases still add one to the counter. The
-- generation is
--
--   GREATEST(base + timeline - 1, external_floor)
--
-- where `timeline` is the server's current timeline: PostgreSQL gives every
-- promotion and every archive recovery that ends with a promotion a new,
-- higher timeline ID, and no server of a lineage writes on a timeline
-- before it was created. So every epoch the old primary granted on timeline
-- T is below (generation(T + 1) << 40) + 1, and the promoted server, now on
-- T + 1 or later, grants above all of them, including for keys it never saw.
-- The timeline is read from the WAL file name of the current insert
-- position, which changes at the promotion itself; pg_control_checkpoint()
-- would report the old timeline until the next checkpoint.
--
-- Why the timeline and not "+1 when something changes": two servers of one
-- lineage that both start from the same row of this table (a primary and a
-- standby promoted from a base backup taken before the primary's first
-- grant after a restore, say) must get different generations. They do
-- exactly when their timelines differ, and PostgreSQL makes them differ.
--
-- Lineage. pg_dump copies this row into a cluster with a new system
-- identifier, whose timeline starts again at 1. The first grant (or
-- lease.raise_generation) that sees a system identifier other than the
-- row's starts a new lineage: its generation is one above every generation
-- the old lineage recorded (the row) or used (the highest generation of any
-- counter in lease.leases), as of the dump. Standbys and base backups keep
-- the system identifier, so they stay in the lineage and the timeline
-- orders them.
--
-- What it rests on: one promotion per timeline. An HA manager (Patroni,
-- pg_auto_failover, ...) promotes one standby per failover, and archive
-- recovery picks a timeline above every one in the archive's history. What
-- breaks it: two standbys of one primary both promoted (they pick the same
-- next timeline, hence the same generation), a restore without the WAL
-- archive's history files that picks a timeline another branch already
-- used, and any split brain with two writable primaries: leasehold orders
-- the epochs of one history, not of two diverging ones.
--
-- Bounds: one key takes fewer than 2^40 grants plus releases within one
-- generation (beyond that its counter reaches the next generation's floor:
-- still above every epoch this server granted, I3, but no longer above a
-- later generation's first grants); the generation is at most 2^23 - 1, so
-- epochs stay positive bigints.
--
-- Columns:
--   system_identifier: the lineage, pg_control_system()'s identifier of the
--          cluster that wrote the row last.
--   base: generation = base + timeline - 1 (install makes it 0 on the
--          install's timeline, so no epoch existing before install changes).
--   last_timeline: the highest timeline a grant has recorded (what a dump
--          carries into a new lineage). Recorded without waiting: a grant
--          that finds the row locked leaves it to a later one.
--   external_floor: the lowest generation an operator allows
--          (lease.raise_generation, 2026-11-30-000004); 0 until raised.
--   pruned_through: the pruning watermark (2026-11-30-000005): at least
--          the counter of every key row ever pruned, so a never-seen key's
--          first grant, at least pruned_through + 1, is above every epoch
--          a pruned key had. Only raised; 0 until the first prune.
--   checked_start: pg_postmaster_start_time() of the server that last
--          compared system_identifier with its own. The common grant (the
--          one-statement grant below and the fast path of
--          2026-11-30-000007) compares this instead of reading the control
--          file at every grant (pg_control_system() opens, reads and closes
--          the file: about 6 µs of a 25 µs fast grant, docs/PERFORMANCE.md).
--          A server's system identifier cannot change while it runs, so a
--          row whose checked_start is this server's start time was checked
--          by this server. A row another server wrote (a standby's copy, a
--          dump restored into another cluster) carries that server's start
--          time, so the first grant here takes lease._generation, which
--          compares the identifiers and records this server's start time.
--          What it rests on: a dump restored into another cluster whose
--          server started in the same microsecond as the dumped one, at the
--          time of its last check, would be taken for the same lineage.
CREATE TABLE lease.lineage (
    singleton         boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    system_identifier bigint  NOT NULL,
    base              bigint  NOT NULL,
    last_timeline     bigint  NOT NULL,
    external_floor    bigint  NOT NULL DEFAULT 0,
    pruned_through    bigint  NOT NULL DEFAULT 0,
    checked_start     timestamptz
);
REVOKE ALL ON TABLE lease.lineage FROM PUBLIC;

-- Whether the calling session may act on `name` (a key or a resource), by
-- the namespace rules. The caller is session_user, the role that logged in:
-- inside a SECURITY DEFINER function current_user is the function's owner,
-- and session_user cannot be changed by an ordinary role (SET ROLE changes
-- current_user only). Membership counts as pg_has_role(..., 'MEMBER')
-- reports it, so a login role acts with every role it may SET ROLE to.
-- PL/pgSQL, not SQL: a SQL function with a sub-select is never inlined, and
-- PostgreSQL plans a non-inlined SQL function's body again at every call
-- (measured: about 50 µs per call); PL/pgSQL keeps the plan for the session.
-- Called through lease._allowed, which skips it while no rule can exist.
CREATE FUNCTION lease._allowed_by_rules(name text)
RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_role oid;
BEGIN
    SELECT n.role_oid INTO v_role
      FROM lease.namespaces AS n
     WHERE starts_with(_allowed_by_rules.name, n.prefix)
     ORDER BY octet_length(n.prefix) DESC
     LIMIT 1;
    IF NOT FOUND THEN
        RETURN true;
    END IF;
    RETURN pg_has_role(session_user, v_role, 'MEMBER');
END;
$$;

-- Whether the calling session may act on `name` (docs/SPECIFICATION.md §4):
-- every API function asks this first. While lease.namespaces has no pages
-- it has no rows, committed or not, so there is no rule to look up: a file
-- size read (about 1.5 µs) instead of a PL/pgSQL call and a query (about
-- 4.5 µs; docs/PERFORMANCE.md). A table that once had rules keeps its
-- pages, and so the full check, until VACUUM truncates them; the size is
-- read under the table's ACCESS SHARE lock, which that truncation
-- conflicts with, so it is never read half-way. An SQL function without a
-- sub-select, so the planner inlines it into every caller; VOLATILE because
-- pg_relation_size is (a STABLE one would not be inlined).
CREATE FUNCTION lease._allowed(name text)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT pg_relation_size('lease.namespaces'::regclass) = 0
           OR lease._allowed_by_rules(_allowed.name)
$$;

-- Raised when the caller may not act on `name` (docs/SPECIFICATION.md §4).
-- Names the caller's own argument and role, never the rule's role or
-- anything about the key's state.
CREATE FUNCTION lease._raise_forbidden(caller text, argument text, name text)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RAISE EXCEPTION 'permission denied for lease.%: role % may not act on % %', caller, session_user, argument, name
        USING ERRCODE = '42501',
              CONSTRAINT = 'lease_namespace_denied',
              DETAIL = format('%s=%s role=%s', argument, name, session_user),
              HINT = 'An operator bound this name''s prefix to another role; connect as a member of that role.';
END;
$$;

-- Input violations (docs/SPECIFICATION.md §1.4), used only on the error path:
-- each returns the violated rules of one argument, phrased as what the caller
-- must do, or an empty array. A function lists its arguments in the order its
-- messages have always named them: key, owner, ttl, wait, epoch.

-- A name (key, owner, resource): not NULL, not empty, at most 16 KiB
-- (docs/SPECIFICATION.md §1.3: names are stored, so their size is capped).
CREATE FUNCTION lease._text_violations(argument text, value text)
RETURNS text[]
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE
        WHEN value IS NULL THEN ARRAY[argument || ' must not be NULL']
        WHEN value = '' THEN ARRAY[argument || ' must not be empty']
        WHEN octet_length(value) > 16384 THEN ARRAY[argument || ' must be at most 16384 bytes']
        ELSE ARRAY[]::text[]
    END
$$;

-- A ttl or wait is judged by the time it adds to the clock now
-- (docs/SPECIFICATION.md §1.3), not by interval ordering, which counts a
-- month as 30 days and a day as 24 hours: '-1 year 361 days' orders above
-- zero yet moves the clock back. The functions' inline check accepts only
-- what ordering judges exactly: a plain span (no months, no days) above zero
-- (or at least zero, for a wait) and at most 100 years; the Rust client
-- always sends one. Anything else, NULL included, goes to the error path,
-- where the helpers below judge it by the time it adds and return no
-- violation when it is fine after all.

-- The inline check of a ttl, for a non-NULL ttl. A SQL function the planner
-- inlines into the caller's expression.
CREATE FUNCTION lease._plain_ttl(ttl interval)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT ttl > interval '0' AND ttl <= interval '100 years'
       AND date_part('day', ttl) = 0 AND date_part('month', ttl) = 0 AND date_part('year', ttl) = 0
$$;

-- The inline check of a wait, for a non-NULL wait.
CREATE FUNCTION lease._plain_wait(wait interval)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT wait >= interval '0' AND wait <= interval '100 years'
       AND date_part('day', wait) = 0 AND date_part('month', wait) = 0 AND date_part('year', wait) = 0
$$;

-- What a non-NULL interval does to the clock now (in the session's time
-- zone, as the grant's own `now + ttl` does): 'negative', 'zero', 'ok' (at
-- most 100 years ahead), 'over' (more), or 'overflow' when PostgreSQL cannot
-- add it to now at all (for example '-2000000 mon 60000001 days': its months
-- alone reach before 4713 BC). Only ever called on the error path, so its
-- exception block costs the hot path nothing.
CREATE FUNCTION lease._span_effect(span interval)
RETURNS text
LANGUAGE plpgsql VOLATILE
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
    ELSIF v_end > v_now + interval '100 years' THEN
        RETURN 'over';
    END IF;
    RETURN 'ok';
EXCEPTION WHEN datetime_field_overflow OR interval_field_overflow THEN
    RETURN 'overflow';
END;
$$;

-- A ttl: not NULL; now + ttl after now and at most now + 100 years.
CREATE FUNCTION lease._ttl_violations(ttl interval)
RETURNS text[]
LANGUAGE sql VOLATILE
AS $$
    SELECT CASE
        WHEN ttl IS NULL THEN ARRAY['ttl must not be NULL']
        ELSE CASE lease._span_effect(ttl)
            WHEN 'negative' THEN ARRAY['ttl must be positive']
            WHEN 'zero' THEN ARRAY['ttl must be positive']
            WHEN 'over' THEN ARRAY['ttl must be at most 100 years']
            WHEN 'overflow' THEN ARRAY['ttl must not overflow when added to the current time']
            ELSE ARRAY[]::text[]
        END
    END
$$;

-- A wait: not NULL; now + wait not before now and at most now + 100 years.
CREATE FUNCTION lease._wait_violations(wait interval)
RETURNS text[]
LANGUAGE sql VOLATILE
AS $$
    SELECT CASE
        WHEN wait IS NULL THEN ARRAY['wait must not be NULL']
        ELSE CASE lease._span_effect(wait)
            WHEN 'negative' THEN ARRAY['wait must not be negative']
            WHEN 'over' THEN ARRAY['wait must be at most 100 years']
            WHEN 'overflow' THEN ARRAY['wait must not overflow when added to the current time']
            ELSE ARRAY[]::text[]
        END
    END
$$;

-- An epoch: not NULL and, when `minimum` is given, at least `minimum`
-- (phrased "must not be negative" for a minimum of 0). A NULL minimum means
-- any value is valid input (renew, release and check_held answer a wrong
-- epoch with a status or an error of their own).
CREATE FUNCTION lease._epoch_violations(argument text, value bigint, minimum bigint)
RETURNS text[]
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE
        WHEN value IS NULL THEN ARRAY[argument || ' must not be NULL']
        WHEN value < minimum AND minimum = 0 THEN ARRAY[argument || ' must not be negative']
        WHEN value < minimum THEN ARRAY[argument || ' must be at least ' || minimum::text]
        ELSE ARRAY[]::text[]
    END
$$;

-- Raises invalid_input (SQLSTATE 22023) naming every violation; the stable
-- machine-readable name travels in the CONSTRAINT field. Returns without
-- raising when there is none: an interval the inline check sent to the error
-- path can turn out fine by the time it adds.
CREATE FUNCTION lease._raise_invalid(caller text, violations text[])
RETURNS void
LANGUAGE plpgsql IMMUTABLE
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

-- Why a renew, release or lease check for (key, owner, epoch) did not apply,
-- read from the key's row as committed now (a fresh snapshot, no lock: a
-- caller that is refused keeps nothing). Precedence as in
-- docs/SPECIFICATION.md §1.3: not_owner, then lapsed, then epoch_mismatch.
-- Returns 'ok' when the row does match after all (a change committed after
-- the caller's write looked), so the caller tries its write again.
CREATE FUNCTION lease._status(key_hash bytea, key text, owner text, epoch bigint)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_row record;
BEGIN
    SELECT l.owner, l.epoch, lease._expiry(l) AS expires_at, l.lapsed_owner INTO v_row
      FROM lease.leases AS l
     WHERE l.key_hash = _status.key_hash AND l.key = _status.key;
    IF NOT FOUND OR v_row.owner IS NULL THEN
        RETURN 'not_owner';
    END IF;
    IF v_row.owner <> owner THEN
        IF v_row.lapsed_owner = owner THEN
            RETURN 'lapsed';
        END IF;
        RETURN 'not_owner';
    END IF;
    IF v_row.expires_at <= clock_timestamp() THEN
        RETURN 'lapsed';
    END IF;
    IF v_row.epoch <> epoch THEN
        RETURN 'epoch_mismatch';
    END IF;
    RETURN 'ok';
END;
$$;

-- The lock_timeout, in milliseconds, for one blocking attempt of
-- lease.acquire to lock a key's row: what is `left` of the wait, or, for a
-- call without a wait (`left` NULL), the fixed bound of 1 second that
-- docs/SPECIFICATION.md §1.5 states. Never 0, which would mean "no limit".
CREATE FUNCTION lease._lock_budget("left" interval)
RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE
        WHEN "left" IS NULL THEN '1000'
        ELSE GREATEST(1, ceil(EXTRACT(epoch FROM "left") * 1000))::bigint::text
    END
$$;

-- Raised when lease.acquire's wait ran out (SQLSTATE 57014). `reason` says
-- whether another owner held the key or another transaction kept its row
-- locked for the whole bound.
CREATE FUNCTION lease._raise_wait_timeout(key text, wait interval, reason text)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    RAISE EXCEPTION 'lease wait timed out: key % %', key, reason
        USING ERRCODE = '57014',
              CONSTRAINT = 'lease_wait_timeout',
              DETAIL = format('key=%s wait=%s', key, wait),
              HINT = 'Retry later, wait longer, or inspect the key to see who holds it and until when.';
END;
$$;

-- The server's timeline, without lag: the first 8 hex digits of the WAL file
-- name of the current insert position, which takes the new timeline at the
-- moment of a promotion. During recovery (a standby) there is no insert
-- position; the timeline of the last checkpoint or restartpoint is the best
-- a standby knows. Inlined by the planner (no sub-select); about 1 µs.
CREATE FUNCTION lease._timeline()
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
    SELECT CASE WHEN pg_is_in_recovery()
                THEN (pg_control_checkpoint()).timeline_id::bigint
                ELSE ('x' || substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8))::bit(32)::bigint
           END
$$;

-- The current generation (see lease.lineage).
--
-- With `write_row` (a grant, or lease.raise_generation), the call keeps the
-- row up to date: a timeline above last_timeline is recorded, and a system
-- identifier other than the row's starts a new lineage. Recording the
-- timeline never waits (SKIP LOCKED): the generation does not depend on it,
-- and a grant that finds the row locked leaves it to a later grant. A new
-- lineage must be written exactly once, so the row is locked for it; with
-- `may_wait` false the lock is taken NOWAIT and raises lock_not_available,
-- which lease.acquire turns into a retry within its lock budget (§1.5: every
-- wait of acquire is bounded). After the lock, the row is read again: another
-- grant may have started the lineage already.
--
-- Without `write_row` (lease.generation, which a standby can call) nothing
-- is written or locked; on a new system identifier it reports the
-- generation the next grant will start.
--
-- It also records this server's start time as the row's checked_start
-- once it has compared the identifiers (see lease.lineage), the same way
-- and in the same write as a new timeline.
--
-- Cost on the common path (same lineage, same timeline), measured in a
-- PL/pgSQL loop of 100 000 calls: about 11 µs, of which pg_control_system()
-- reading the control file is about 3.5 µs, the timeline about 1 µs, and
-- the read of the one-row table with the call itself the rest. A scalar
-- result: called as `FROM lease._generation(...)` with OUT columns it cost
-- about 5 µs more; the same read written as a sub-select inside the grant's
-- statement was no cheaper. Only grants call it: renew, release, inspect
-- and the guards never do.
CREATE FUNCTION lease._generation(write_row boolean, may_wait boolean)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_row record;
    v_sysid bigint;
    v_start timestamptz;
    generation bigint;
    timeline bigint;
BEGIN
    timeline := lease._timeline();
    v_sysid := (pg_control_system()).system_identifier;
    v_start := pg_postmaster_start_time();
    SELECT g.system_identifier, g.base, g.last_timeline, g.external_floor, g.checked_start INTO v_row
      FROM lease.lineage AS g
     WHERE g.singleton;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'leasehold''s lineage row is missing from lease.lineage'
            USING ERRCODE = 'XX000',
                  HINT = 'The table is written only by leasehold''s install; restore it from a backup of this database.';
    END IF;
    IF v_row.system_identifier <> v_sysid AND write_row THEN
        IF may_wait THEN
            SELECT g.system_identifier, g.base, g.last_timeline, g.external_floor, g.checked_start INTO v_row
              FROM lease.lineage AS g
             WHERE g.singleton
               FOR NO KEY UPDATE;
        ELSE
            SELECT g.system_identifier, g.base, g.last_timeline, g.external_floor, g.checked_start INTO v_row
              FROM lease.lineage AS g
             WHERE g.singleton
               FOR NO KEY UPDATE NOWAIT;
        END IF;
    END IF;
    IF v_row.system_identifier = v_sysid THEN
        -- Same lineage. last_timeline is never above the timeline (the row
        -- was written by WAL this server replayed), but the GREATEST keeps
        -- the generation from going back should it ever be.
        generation := GREATEST(v_row.base + GREATEST(timeline, v_row.last_timeline) - 1,
                               v_row.external_floor);
        IF write_row AND (timeline > v_row.last_timeline
                          OR v_row.checked_start IS DISTINCT FROM v_start) THEN
            PERFORM 1 FROM lease.lineage AS g
             WHERE g.singleton AND g.system_identifier = v_sysid
               AND (g.last_timeline < timeline OR g.checked_start IS DISTINCT FROM v_start)
               FOR NO KEY UPDATE SKIP LOCKED;
            IF FOUND THEN
                UPDATE lease.lineage AS g
                   SET last_timeline = GREATEST(g.last_timeline, timeline),
                       checked_start = v_start
                 WHERE g.singleton;
            END IF;
        END IF;
        RETURN generation;
    END IF;
    -- A new lineage (a dump restored into another cluster): one above every
    -- generation the old lineage recorded in this row or used in a counter,
    -- pruned counters included (the watermark).
    generation := GREATEST(v_row.base + v_row.last_timeline - 1,
                           v_row.external_floor,
                           (SELECT max(l.epoch) >> 40 FROM lease.leases AS l),
                           (SELECT g.pruned_through >> 40 FROM lease.lineage AS g WHERE g.singleton)) + 1;
    IF write_row THEN
        UPDATE lease.lineage AS g
           SET system_identifier = v_sysid,
               base = generation + 1 - timeline,
               last_timeline = timeline,
               checked_start = v_start
         WHERE g.singleton;
    END IF;
    RETURN generation;
END;
$$;

-- The generation's bounds (see lease.lineage): at most 2^23 - 1, so that
-- (generation << 40) + 1 and every counter below the next generation stay
-- positive bigints.
CREATE FUNCTION lease._max_generation()
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 8388607::bigint $$;

-- The input checks of lease.renew and lease.release (docs/SPECIFICATION.md
-- §1.4), raising 22023 when the input is invalid. They run only where a call
-- does not succeed at once: a renewal or release that succeeds matched a
-- stored key, owner and epoch, which were checked when they were stored,
-- and a renewal's UPDATE checks its ttl itself, so checking them up front
-- cost every call (about 4 µs, docs/PERFORMANCE.md) for nothing. A caller
-- refused by a namespace rule hears about bad input first, as ever.
CREATE FUNCTION lease._check_renew_input(key text, owner text, epoch bigint, ttl interval)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF key IS NULL OR key = '' OR owner IS NULL OR owner = '' OR epoch IS NULL
       OR octet_length(key) > 16384 OR octet_length(owner) > 16384
       OR ttl IS NULL OR NOT lease._plain_ttl(ttl) THEN
        PERFORM lease._raise_invalid('renew',
            lease._text_violations('key', key) || lease._text_violations('owner', owner)
            || lease._ttl_violations(ttl) || lease._epoch_violations('epoch', epoch, NULL));
    END IF;
END;
$$;

CREATE FUNCTION lease._check_release_input(key text, owner text, epoch bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF key IS NULL OR key = '' OR owner IS NULL OR owner = '' OR epoch IS NULL
       OR octet_length(key) > 16384 OR octet_length(owner) > 16384 THEN
        PERFORM lease._raise_invalid('release',
            lease._text_violations('key', key) || lease._text_violations('owner', owner)
            || lease._epoch_violations('epoch', epoch, NULL));
    END IF;
END;
$$;

-- What happens after a key became FREE: called by every function that
-- frees a key (lease.release, lease.force_release), in the freeing
-- transaction, after its UPDATE. Nothing here; 2026-11-30-000003 puts the
-- wake-up of waiters in its place. A call, not a trigger: a row trigger's
-- queue and call cost a release about 20 µs (docs/PERFORMANCE.md), a call
-- to this function about 2.
CREATE FUNCTION lease._on_release(key_hash bytea)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
END;
$$;

-- Row locks on lease.leases (docs/SPECIFICATION.md §1.5). The modes are
-- chosen so that nothing a non-holder can do holds up a holder's renew:
-- * renew and release update the row and so take FOR NO KEY UPDATE: they
--   wait only for another renew, release or grant of the same key.
-- * A grant to a new owner (a FREE or LAPSED key) first locks the row FOR
--   UPDATE, the one mode that conflicts with FOR KEY SHARE, so it waits for
--   every transaction that checked the lease (G6) before it takes over.
-- * Checks that change nothing (an idempotent same-owner acquire,
--   check_held, admit_held, admit, fence) take FOR KEY SHARE, which a
--   renew or release does not wait for.
-- * A refused call keeps no lock: refusals read without locking, or lock
--   in a subtransaction that is rolled back.
-- Every lock lease.acquire waits for is bounded by its wait (1 second when
-- there is none); see lease._lock_budget.

-- Grants `key` to `owner` for `ttl` when it is FREE, LAPSED or never seen
-- (docs/SPECIFICATION.md §1.3), waiting up to `wait` for it by polling. A
-- grant locks the key's row until the caller's transaction ends; a denied or
-- waiting attempt keeps no lock (each attempt is a subtransaction).
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
    -- The lowest epoch a grant may take: (generation << 40) + 1.
    v_floor bigint;
    -- Whether attempts lock with a bounded wait (after one met a locked row
    -- with NOWAIT), and the caller's lock_timeout to put back after a grant.
    v_blocking boolean := false;
    v_saved_lock_timeout text;
    -- Whether the current attempt waits within a lock_timeout budget.
    v_budgeted boolean;
    -- What is left of the wait when an attempt sets its budget. A variable,
    -- not the expression itself, as lease._lock_budget's argument: the
    -- planner inlines a SQL function only when an argument it uses twice is
    -- not volatile, and clock_timestamp() is; not inlined, the function was
    -- parsed and planned again at every call (about 30 µs, docs/PERFORMANCE.md).
    v_left interval;
    -- Whether the first read found no row for the key (see below).
    v_absent boolean := false;
BEGIN
    IF key IS NULL OR key = '' OR owner IS NULL OR owner = ''
       OR octet_length(key) > 16384 OR octet_length(owner) > 16384
       OR ttl IS NULL OR NOT lease._plain_ttl(ttl)
       OR wait IS NULL OR NOT lease._plain_wait(wait) THEN
        PERFORM lease._raise_invalid('acquire',
            lease._text_violations('key', key) || lease._text_violations('owner', owner)
            || lease._ttl_violations(ttl) || lease._wait_violations(wait));
    END IF;
    IF NOT lease._allowed(key) THEN
        PERFORM lease._raise_forbidden('acquire', 'key', key);
    END IF;
    v_hash := lease._key_hash(key);
    -- Judged by the time it adds, like the input check: '1 mon -30 days'
    -- orders as zero but waits a day at the end of a 31-day month.
    v_now := clock_timestamp();
    IF v_now + wait > v_now THEN
        v_deadline := v_now + wait;
    END IF;
    -- The common denial, decided first. The fast path (lease.fast_acquire,
    -- 2026-11-30-000007) takes the common grants, so a call that reaches
    -- this function is most often a denial. Under READ COMMITTED, a call
    -- that does not wait and finds the key held by another owner is denied
    -- here: the row is read as the first attempt below reads it (no lock,
    -- the statement's snapshot), so the answer is the one that attempt
    -- would give, without the grant statement or the attempt's
    -- subtransaction (docs/PERFORMANCE.md). Anything else goes on.
    IF v_deadline IS NULL AND current_setting('transaction_isolation') = 'read committed' THEN
        SELECT l.owner, lease._expiry(l) AS expires_at INTO v_row
          FROM lease.leases AS l
         WHERE l.key_hash = v_hash AND l.key = acquire.key;
        v_absent := NOT FOUND;
        IF FOUND AND v_row.owner <> acquire.owner AND v_row.expires_at > clock_timestamp() THEN
            acquired := false;
            epoch := NULL;
            expires_at := NULL;
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    -- The common grant in one statement, without a subtransaction
    -- (docs/PERFORMANCE.md): an existing FREE or LAPSED row that nobody has
    -- locked, on a server whose lineage row is current (checked by this
    -- server, see lease.lineage's checked_start; no timeline recorded
    -- since). `c` locks the row FOR UPDATE (the lock mode
    -- a grant to a new owner needs, see above) and SKIP LOCKED never waits,
    -- so a locked row leaves this path at once; `g` is the generation that
    -- lease._generation would compute without writing. Anything else (a
    -- never-seen key, a held key, a row another transaction locked, a
    -- lineage or timeline to record) finds no row here and takes the
    -- attempts below, which decide it as they always did. If `c` locked the
    -- row and `g` is empty, the lock is ours and the first attempt grants.
    -- A key the read above found no row for (a first grant) skips the
    -- grant statement, which could only find nothing.
    IF NOT v_absent THEN
        WITH g AS (
            SELECT GREATEST(g.base + g.last_timeline - 1, g.external_floor) AS generation
              FROM lease.lineage AS g
             WHERE g.singleton
               AND g.checked_start = pg_postmaster_start_time()
               AND g.last_timeline = lease._timeline()
        ), c AS (
            SELECT l.key_hash
              FROM lease.leases AS l
             WHERE l.key_hash = v_hash AND l.key = acquire.key
               AND (l.owner IS NULL OR l.expires_at <= clock_timestamp())
               AND l.group_id IS NULL
               FOR UPDATE SKIP LOCKED
        )
        UPDATE lease.leases AS l
           SET owner = acquire.owner,
               epoch = GREATEST(l.epoch + 1, (g.generation << 40) + 1),
               expires_at = clock_timestamp() + acquire.ttl,
               lapsed_owner = l.owner
          FROM g, c
         WHERE l.key_hash = v_hash AND l.key = acquire.key AND c.key_hash = v_hash
        RETURNING l.epoch, l.expires_at INTO v_epoch, v_expires;
        IF FOUND THEN
            v_outcome := 'granted';
        END IF;
    END IF;
    <<attempt>>
    WHILE v_outcome IS DISTINCT FROM 'granted' LOOP
        -- Each pass sees a newer state than the last; a key cannot keep
        -- changing under us for ever. The bound turns an impossible endless
        -- loop into an error instead of a hung session.
        v_attempts := v_attempts + 1;
        IF v_attempts > 100000 THEN
            RAISE EXCEPTION 'lease.acquire could not settle the state of key % after % attempts', key, v_attempts
                USING ERRCODE = '40001', CONSTRAINT = 'lease_contention', HINT = 'Retry the call.';
        END IF;
        v_outcome := NULL;
        v_budgeted := false;
        -- One attempt runs in a subtransaction that is rolled back when it
        -- does not grant, so a denied or waiting acquire keeps no lock (and
        -- a lock_timeout set for the attempt goes with it).
        BEGIN
            IF v_blocking THEN
                IF v_saved_lock_timeout IS NULL THEN
                    v_saved_lock_timeout := current_setting('lock_timeout');
                END IF;
                v_left := v_deadline - clock_timestamp();
                PERFORM set_config('lock_timeout', lease._lock_budget(v_left), true);
                v_budgeted := true;
            END IF;
            -- Common path: the key exists and is FREE or LAPSED. Lock it FOR
            -- UPDATE (see the lock modes above), which re-checks the
            -- condition on the newest version once any lock it waited for
            -- is gone. The first attempt does not wait at all (NOWAIT).
            IF v_blocking THEN
                SELECT l.owner, l.group_id INTO v_row
                  FROM lease.leases AS l
                 WHERE l.key_hash = v_hash AND l.key = acquire.key
                   AND (l.owner IS NULL OR NOT lease._live(l))
                   FOR UPDATE;
            ELSE
                SELECT l.owner, l.group_id INTO v_row
                  FROM lease.leases AS l
                 WHERE l.key_hash = v_hash AND l.key = acquire.key
                   AND (l.owner IS NULL OR NOT lease._live(l))
                   FOR UPDATE NOWAIT;
            END IF;
            IF FOUND THEN
                -- A lapsed grant in a heartbeat group leaves the group, whose
                -- row is written here: the lock orders this takeover against a
                -- heartbeat in flight (lease.renew_group). A heartbeat that
                -- committed first made the group live again, and the row's
                -- condition, checked again on that newest version, no longer
                -- holds: the key is held after all, and the next attempt says
                -- so. A heartbeat that comes second answers with one member
                -- fewer. Waits as the key's row lock does.
                IF v_row.group_id IS NOT NULL THEN
                    IF v_blocking THEN
                        PERFORM 1 FROM lease.groups AS g
                         WHERE g.id = v_row.group_id AND g.expires_at <= clock_timestamp()
                           FOR NO KEY UPDATE;
                    ELSE
                        PERFORM 1 FROM lease.groups AS g
                         WHERE g.id = v_row.group_id AND g.expires_at <= clock_timestamp()
                           FOR NO KEY UPDATE NOWAIT;
                    END IF;
                    IF FOUND OR lease._group_expiry(v_row.group_id) IS NULL THEN
                        PERFORM lease._left_groups(ARRAY[v_row.group_id]);
                    ELSE
                        RAISE EXCEPTION USING ERRCODE = 'LH001';   -- held after all: look again
                    END IF;
                END IF;
                -- The clock is read after every wait, so the grant is never
                -- expired on arrival. The counter moves on by one, or to the
                -- generation's floor when that is higher (§1.2: a promoted
                -- server grants above every epoch of the old primary); a
                -- lapsed grant's owner is remembered (rule 2).
                v_floor := (lease._generation(true, v_budgeted) << 40) + 1;
                UPDATE lease.leases AS l
                   SET owner = acquire.owner,
                       epoch = GREATEST(l.epoch + 1, v_floor),
                       expires_at = clock_timestamp() + acquire.ttl,
                       lapsed_owner = l.owner,
                       group_id = NULL
                 WHERE l.key_hash = v_hash AND l.key = acquire.key
                RETURNING l.epoch, l.expires_at INTO v_epoch, v_expires;
                v_outcome := 'granted';
            ELSE
                SELECT l.owner, l.epoch, lease._expiry(l) AS expires_at INTO v_row
                  FROM lease.leases AS l
                 WHERE l.key_hash = v_hash AND l.key = acquire.key;
                IF NOT FOUND THEN
                    -- Never-seen key: the first grant is the generation's
                    -- floor, epoch 1 on a server never promoted or
                    -- restored, or one above the pruning watermark when
                    -- that is higher (a key whose row was pruned comes
                    -- back above every epoch it had; the watermark is
                    -- read after the row was found missing, and a prune
                    -- raises it in the transaction that deletes the row).
                    -- A concurrent first grant that has not committed
                    -- makes the insert wait for it, so it always waits
                    -- bounded.
                    IF NOT v_budgeted THEN
                        v_saved_lock_timeout := COALESCE(v_saved_lock_timeout, current_setting('lock_timeout'));
                        v_left := v_deadline - clock_timestamp();
                        PERFORM set_config('lock_timeout', lease._lock_budget(v_left), true);
                        v_budgeted := true;
                    END IF;
                    v_floor := GREATEST((lease._generation(true, true) << 40) + 1,
                                        (SELECT g.pruned_through + 1 FROM lease.lineage AS g WHERE g.singleton));
                    INSERT INTO lease.leases AS l (key, key_hash, owner, epoch, expires_at, lapsed_owner, first_epoch)
                    VALUES (acquire.key, v_hash, acquire.owner, v_floor, clock_timestamp() + acquire.ttl, NULL, v_floor)
                    ON CONFLICT (key_hash) DO NOTHING
                    RETURNING l.epoch, l.expires_at INTO v_epoch, v_expires;
                    IF FOUND THEN
                        v_outcome := 'granted';
                    END IF;
                ELSIF v_row.owner IS NOT NULL AND v_row.expires_at > clock_timestamp() THEN
                    IF v_row.owner = owner THEN
                        -- Idempotent success. FOR KEY SHARE holds off a
                        -- takeover until the caller commits (G6: a write in
                        -- the same transaction is checked) without holding
                        -- up the holder's renew.
                        IF v_blocking THEN
                            SELECT l.epoch, lease._expiry(l) AS expires_at INTO v_row
                              FROM lease.leases AS l
                             WHERE l.key_hash = v_hash AND l.key = acquire.key
                               AND l.owner = acquire.owner AND lease._live(l)
                               FOR KEY SHARE;
                        ELSE
                            SELECT l.epoch, lease._expiry(l) AS expires_at INTO v_row
                              FROM lease.leases AS l
                             WHERE l.key_hash = v_hash AND l.key = acquire.key
                               AND l.owner = acquire.owner AND lease._live(l)
                               FOR KEY SHARE NOWAIT;
                        END IF;
                        IF FOUND THEN
                            v_outcome := 'granted';
                            v_epoch := v_row.epoch;
                            v_expires := v_row.expires_at;
                        END IF;
                    ELSE
                        -- Under REPEATABLE READ or SERIALIZABLE the snapshot
                        -- can show a grant that has ended since: a locking
                        -- read of a row changed after the snapshot raises
                        -- 40001 instead of a denial from the past
                        -- (docs/SPECIFICATION.md §1.5). The attempt's
                        -- rollback drops the lock.
                        IF current_setting('transaction_isolation') <> 'read committed' THEN
                            IF v_blocking THEN
                                PERFORM 1 FROM lease.leases AS l
                                 WHERE l.key_hash = v_hash AND l.key = acquire.key FOR SHARE;
                            ELSE
                                PERFORM 1 FROM lease.leases AS l
                                 WHERE l.key_hash = v_hash AND l.key = acquire.key FOR SHARE NOWAIT;
                            END IF;
                        END IF;
                        v_outcome := 'denied';
                    END IF;
                END IF;
                -- Otherwise the key became acquirable after the lock
                -- attempt looked: try again.
            END IF;
            IF v_outcome IS DISTINCT FROM 'granted' THEN
                RAISE EXCEPTION USING ERRCODE = 'LH001';   -- roll the attempt back
            END IF;
        EXCEPTION
            WHEN SQLSTATE 'LH001' THEN
                NULL;   -- the attempt's locks are gone with it
            WHEN lock_not_available THEN
                -- A row lock did not come within NOWAIT or the budget.
                IF v_budgeted AND v_deadline IS NULL THEN
                    PERFORM lease._raise_wait_timeout(key, wait,
                        'stayed locked by another transaction for 1 second (the bound of a call without a wait)');
                END IF;
                v_blocking := true;
                v_outcome := 'busy';
        END;
        IF v_outcome = 'granted' THEN
            IF v_saved_lock_timeout IS NOT NULL THEN
                PERFORM set_config('lock_timeout', v_saved_lock_timeout, true);
            END IF;
            EXIT attempt;
        END IF;
        IF v_outcome = 'busy' THEN
            IF v_deadline IS NOT NULL AND clock_timestamp() >= v_deadline THEN
                PERFORM lease._raise_wait_timeout(key, wait,
                    format('stayed locked by another transaction for the whole wait of %s', wait));
            END IF;
            CONTINUE attempt;   -- lock again, now waiting within the budget
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
            PERFORM lease._raise_wait_timeout(key, wait,
                format('stayed held by another owner for the whole wait of %s', wait));
        END IF;
        -- Poll: the seed's 50 ms interval, never sleeping past the deadline.
        PERFORM pg_sleep(LEAST(0.05,
            GREATEST(0, EXTRACT(epoch FROM v_deadline - clock_timestamp()))::double precision));
    END LOOP;
    -- Granted, at once or by an attempt. §1.4: the grant is durable at
    -- commit whatever the caller's session asked for. Raised for this
    -- transaction only, and only from below `on`; remote_write and
    -- remote_apply stay.
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    acquired := true;
    epoch := v_epoch;
    expires_at := v_expires;
    RETURN NEXT;
END;
$$;

-- Extends the grant (key, owner, epoch) to now + ttl while it is live
-- (docs/SPECIFICATION.md §1.3); otherwise answers why not. A renewal locks
-- the key's row until the caller's transaction ends; a refusal locks nothing.
CREATE FUNCTION lease.renew(key text, owner text, epoch bigint, ttl interval)
RETURNS TABLE (status text, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_hash bytea;
    -- Whether the whole input was checked (see lease._check_renew_input).
    v_checked boolean := false;
BEGIN
    IF NOT lease._allowed(key) THEN
        PERFORM lease._check_renew_input(key, owner, epoch, ttl);
        PERFORM lease._raise_forbidden('renew', 'key', key);
    END IF;
    v_hash := lease._key_hash(key);
    -- A second pass only when a change committed between the UPDATE's
    -- snapshot and the status read made the grant match, or when a ttl
    -- that is not a plain span turned out to be fine.
    FOR v_pass IN 1..100 LOOP
        UPDATE lease.leases AS l
           SET expires_at = clock_timestamp() + renew.ttl
         WHERE l.key_hash = v_hash AND l.key = renew.key AND l.owner = renew.owner AND l.epoch = renew.epoch
           AND lease._live(l)
           AND (v_checked OR lease._plain_ttl(renew.ttl))
        RETURNING l.expires_at INTO renew.expires_at;
        IF FOUND THEN
            -- §1.4: durable at commit (see lease.acquire).
            IF current_setting('synchronous_commit') IN ('off', 'local') THEN
                PERFORM set_config('synchronous_commit', 'on', true);
            END IF;
            status := 'ok';
            RETURN NEXT;
            RETURN;
        END IF;
        IF NOT v_checked THEN
            PERFORM lease._check_renew_input(key, owner, epoch, ttl);
            v_checked := true;
        END IF;
        status := lease._status(v_hash, key, owner, epoch);
        IF status <> 'ok' THEN
            expires_at := NULL;
            RETURN NEXT;
            RETURN;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'lease.renew could not settle the state of key %', key
        USING ERRCODE = '40001', CONSTRAINT = 'lease_contention', HINT = 'Retry the call.';
END;
$$;

-- Ends the grant (key, owner, epoch) while it is live: the key becomes FREE
-- and its counter moves on by one (docs/SPECIFICATION.md §1.3); otherwise
-- answers why not. A release locks the key's row until the caller's
-- transaction ends; a refusal locks nothing.
CREATE FUNCTION lease.release(key text, owner text, epoch bigint)
RETURNS TABLE (status text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_hash bytea;
    v_group bigint;
    v_released boolean;
BEGIN
    IF NOT lease._allowed(key) THEN
        PERFORM lease._check_release_input(key, owner, epoch);
        PERFORM lease._raise_forbidden('release', 'key', key);
    END IF;
    v_hash := lease._key_hash(key);
    FOR v_pass IN 1..100 LOOP
        UPDATE lease.leases AS l
           SET owner = NULL, expires_at = NULL, lapsed_owner = NULL, epoch = l.epoch + 1
         WHERE l.key_hash = v_hash AND l.key = release.key AND l.owner = release.owner AND l.epoch = release.epoch
           AND l.expires_at > clock_timestamp() AND l.group_id IS NULL;
        v_released := FOUND;
        IF NOT v_released THEN
            -- A grant in a heartbeat group: lock it to learn its group, then
            -- release it and count it out of the group.
            SELECT l.group_id INTO v_group
              FROM lease.leases AS l
             WHERE l.key_hash = v_hash AND l.key = release.key AND l.owner = release.owner AND l.epoch = release.epoch
               AND l.group_id IS NOT NULL AND lease._live(l)
               FOR NO KEY UPDATE;
            v_released := FOUND;
            IF v_released THEN
                UPDATE lease.leases AS l
                   SET owner = NULL, expires_at = NULL, lapsed_owner = NULL, epoch = l.epoch + 1, group_id = NULL
                 WHERE l.key_hash = v_hash AND l.key = release.key;
                PERFORM lease._left_groups(ARRAY[v_group]);
            END IF;
        END IF;
        IF v_released THEN
            PERFORM lease._on_release(v_hash);
            -- §1.4: durable at commit (see lease.acquire).
            IF current_setting('synchronous_commit') IN ('off', 'local') THEN
                PERFORM set_config('synchronous_commit', 'on', true);
            END IF;
            status := 'ok';
            RETURN NEXT;
            RETURN;
        END IF;
        IF v_pass = 1 THEN
            PERFORM lease._check_release_input(key, owner, epoch);
        END IF;
        status := lease._status(v_hash, key, owner, epoch);
        IF status <> 'ok' THEN
            RETURN NEXT;
            RETURN;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'lease.release could not settle the state of key %', key
        USING ERRCODE = '40001', CONSTRAINT = 'lease_contention', HINT = 'Retry the call.';
END;
$$;

-- The key's state as of the call (docs/SPECIFICATION.md §1.3): no row for a
-- never-seen key; owner and expiry only while a grant is live. Locks nothing.
-- A key under another role's namespace is refused, not shown (§4).
CREATE FUNCTION lease.inspect(key text)
RETURNS TABLE (held boolean, owner text, epoch bigint, expires_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    IF key IS NULL OR key = '' OR octet_length(key) > 16384 THEN
        PERFORM lease._raise_invalid('inspect', lease._text_violations('key', key));
    END IF;
    IF NOT lease._allowed(key) THEN
        PERFORM lease._raise_forbidden('inspect', 'key', key);
    END IF;
    RETURN QUERY
        SELECT l.owner IS NOT NULL AND lease._expiry(l) > v_now,
               CASE WHEN l.owner IS NOT NULL AND lease._expiry(l) > v_now THEN l.owner END,
               l.epoch,
               CASE WHEN l.owner IS NOT NULL AND lease._expiry(l) > v_now THEN lease._expiry(l) END
          FROM lease.leases AS l
         WHERE l.key_hash = lease._key_hash(inspect.key) AND l.key = inspect.key;
END;
$$;

-- The server's current generation and timeline (docs/SPECIFICATION.md
-- §1.2): the next grant's epoch is at least (generation << 40) + 1. Read
-- only, for any role and on a standby too (there it reports the timeline of
-- the last restartpoint). Answers nothing about any key.
CREATE FUNCTION lease.generation()
RETURNS TABLE (generation bigint, timeline bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    generation := lease._generation(false, false);
    timeline := lease._timeline();
    RETURN NEXT;
END;
$$;

-- The lineage of this installation: generation 0 on the timeline it is
-- installed on, so epochs start at 1 as they always did.
INSERT INTO lease.lineage (singleton, system_identifier, base, last_timeline, external_floor, checked_start)
SELECT true, (pg_control_system()).system_identifier, 1 - t.timeline, t.timeline, 0, pg_postmaster_start_time()
  FROM (SELECT lease._timeline() AS timeline) AS t;

REVOKE ALL ON FUNCTION lease._key_hash(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._group_expiry(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._expiry(lease.leases) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._live(lease.leases) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._left_groups(bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._allowed_by_rules(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._allowed(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._raise_forbidden(text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._text_violations(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._plain_ttl(interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._plain_wait(interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._span_effect(interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._ttl_violations(interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._wait_violations(interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._epoch_violations(text, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._raise_invalid(text, text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._status(bytea, text, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._lock_budget(interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._raise_wait_timeout(text, interval, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._timeline() FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._generation(boolean, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._max_generation() FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._on_release(bytea) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._check_renew_input(text, text, bigint, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._check_release_input(text, text, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lease.acquire(text, text, interval, interval) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.renew(text, text, bigint, interval) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.release(text, text, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.inspect(text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.generation() TO PUBLIC;
