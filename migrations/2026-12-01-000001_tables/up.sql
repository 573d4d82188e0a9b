-- leasehold, the baseline schema: the server check, schema `lease` and
-- every table, with the invariants of each row as constraints
-- (docs/SPECIFICATION.md §1.1, §2, §4). Migrations hold tables, indexes,
-- types and data, and are never edited once released. Every function lives
-- in the files of sql/functions/, applied after the migrations and again
-- whenever their text changes (docs/ARCHITECTURE.md, "Where the SQL
-- lives"):
--
--   01_rules.sql       one definition of every rule (liveness, expiry, input
--                      bounds, the epoch floor, the namespace decision, ...)
--   02_leases.sql      acquire, renew, release, inspect, generation
--   03_guards.sql      admit, check_held, admit_held, renew_admit, fence,
--                      inspect_guard
--   04_waiting.sql     the waiters' registration protocol
--   05_operator.sql    namespaces, force_release, raise_generation
--   06_pruning.sql     prune_keys, prune_guards
--   07_batches.sql     renew_many, release_many, join_group, renew_group
--
-- The one function here, lease._drop_default_grants, is the migrations'
-- own tool: every migration and every file of functions ends by calling it.
--
-- The rules every migration and every file of functions follows:
--
-- * One path. Every entry point is a PL/pgSQL function. Its arguments are
--   evaluated once (a function call does that), copied into local
--   variables of collation "C" (so every comparison of a name is a byte
--   comparison, whatever collation the caller's expression carries),
--   checked, and only then used. The namespace question is decided on
--   those values before any row of a key is read or locked. There are no
--   rewrite rules and no writable views.
-- * Security. Entry points are SECURITY DEFINER and pin
--   `SET search_path = pg_catalog, pg_temp`; every helper pins it too, so
--   a helper called on its own (by the owner, or a superuser) cannot meet a
--   caller's object in `public` or `pg_temp` either. Leasehold's own objects
--   are always written `lease.`-qualified. Tables are REVOKEd from PUBLIC;
--   the functions are their only writers.
-- * One definition per rule: each rule is a helper of 01_rules.sql, and every
--   other place calls it. tests/leasehold/sql_rules.rs fails when a
--   liveness or expiry comparison is written anywhere else.
-- * Install and upgrade never queue behind a lock for long: every migration
--   and every file of functions sets its own lock_timeout, so a blocked install fails with
--   lock_not_available and changes nothing.

SET LOCAL lock_timeout = '5s';

-- docs/SPECIFICATION.md §4: PostgreSQL 14 or newer (the versions the test
-- matrix runs). Checked first, so an older server gets nothing;
-- leasehold::install runs the same check before its own bookkeeping
-- (src/install.rs).
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
-- runs this very statement before its own bookkeeping, on every install and
-- upgrade, and so does the extension's install script (src/install.rs
-- and src/admin/extension.rs take it from here). The installing role is
-- the extension's owner where leasehold is the extension (its script runs
-- as the bootstrap superuser when a non-superuser creates it), else
-- current_user.
DO $$
DECLARE
    v_installer oid := COALESCE(
        (SELECT e.extowner FROM pg_catalog.pg_extension AS e WHERE e.extname OPERATOR(pg_catalog.=) 'leasehold'),
        (SELECT r.oid FROM pg_catalog.pg_roles AS r WHERE r.rolname OPERATOR(pg_catalog.=) current_user));
    v_owner text;
BEGIN
    SELECT pg_catalog.pg_get_userbyid(n.nspowner) INTO v_owner
      FROM pg_catalog.pg_namespace AS n
     WHERE n.nspname OPERATOR(pg_catalog.=) 'lease'
       AND n.nspowner OPERATOR(pg_catalog.<>) v_installer;
    IF v_owner IS NOT NULL THEN
        RAISE EXCEPTION 'schema lease already exists and is owned by role %, not by the installing role %', v_owner, pg_catalog.pg_get_userbyid(v_installer)
            USING ERRCODE = '42501',
                  CONSTRAINT = 'lease_schema_not_owned',
                  DETAIL = 'owner=' OPERATOR(pg_catalog.||) v_owner,
                  HINT = 'The owner of schema lease could replace leasehold''s functions. Have that role or a superuser drop the schema, or install as that role.';
    END IF;
END
$$;
REVOKE ALL ON SCHEMA lease FROM PUBLIC;
GRANT USAGE ON SCHEMA lease TO PUBLIC;

-- docs/PRIVILEGES.md: default privileges (ALTER DEFAULT
-- PRIVILEGES of the installing role, or of the superuser a trusted
-- extension's script runs as) add grants to every object a migration
-- creates; a monitoring role's "SELECT, TRIGGER on tables" would let it put
-- a trigger on lease.leases that runs as the owner. None of those grants is
-- leasehold's to give. Every migration and every file of functions ends by
-- calling this: it takes back,
-- from each object in schema lease that this transaction wrote, every grant
-- to a role other than the owner and PUBLIC that a default privilege
-- names. (PUBLIC's rights are set by each file's own GRANT and REVOKE
-- statements. A grant an operator made to such a role on an object that a
-- later install replaces is taken back too, which docs/PRIVILEGES.md
-- says.)
CREATE FUNCTION lease._drop_default_grants()
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_xid xid := pg_catalog.xid(pg_catalog.pg_current_xact_id());
    v_schema oid := pg_catalog.to_regnamespace('lease');
    v_grant record;
BEGIN
    FOR v_grant IN
        WITH objects AS (
            SELECT 'SCHEMA' AS kind, pg_catalog.quote_ident(n.nspname) AS name, n.nspowner AS owner,
                   n.nspacl AS acl, 'n'::"char" AS objtype
              FROM pg_catalog.pg_namespace AS n
             WHERE n.oid = v_schema AND n.xmin = v_xid
            UNION ALL
            SELECT CASE WHEN c.relkind = 'S' THEN 'SEQUENCE' ELSE 'TABLE' END, c.oid::regclass::text, c.relowner,
                   c.relacl, CASE WHEN c.relkind = 'S' THEN 'S'::"char" ELSE 'r'::"char" END
              FROM pg_catalog.pg_class AS c
             WHERE c.relnamespace = v_schema AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S') AND c.xmin = v_xid
            UNION ALL
            SELECT 'FUNCTION', p.oid::regprocedure::text, p.proowner, p.proacl, 'f'::"char"
              FROM pg_catalog.pg_proc AS p
             WHERE p.pronamespace = v_schema AND p.xmin = v_xid
            UNION ALL
            SELECT CASE WHEN t.typtype = 'd' THEN 'DOMAIN' ELSE 'TYPE' END, t.oid::regtype::text, t.typowner,
                   t.typacl, 'T'::"char"
              FROM pg_catalog.pg_type AS t
             WHERE t.typnamespace = v_schema AND t.typtype IN ('b', 'd', 'e', 'r', 'm') AND t.typcategory <> 'A'
               AND t.xmin = v_xid
        )
        SELECT DISTINCT o.kind, o.name, a.grantee
          FROM objects AS o, pg_catalog.aclexplode(o.acl) AS a
         WHERE a.grantee <> o.owner AND a.grantee <> 0
           AND EXISTS (SELECT 1
                         FROM pg_catalog.pg_default_acl AS d, pg_catalog.aclexplode(d.defaclacl) AS da
                        WHERE d.defaclobjtype = o.objtype
                          AND d.defaclnamespace IN (0, v_schema)
                          AND da.grantee = a.grantee)
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON %s %s FROM %I CASCADE', v_grant.kind, v_grant.name,
                                  pg_catalog.pg_get_userbyid(v_grant.grantee));
    END LOOP;
END;
$$;
REVOKE ALL ON FUNCTION lease._drop_default_grants() FROM PUBLIC;

-- Every function and operator in a constraint below is written
-- pg_catalog-qualified, so that no object a role put on the installer's
-- search_path can stand in for a built-in.

-- The two domains of the tables' columns: what a stored name and a stored
-- epoch are. A domain's CHECK is planned once per backend and checked only
-- when a value is assigned to the column, so it costs a write almost
-- nothing; a table CHECK constraint is planned again at every statement
-- that writes the table (about 4 µs each, docs/PERFORMANCE.md), which is
-- why the table constraints below are only the ones across columns.
--   lease_name: a key, owner or resource name: 1 to 16384 bytes, compared
--          as bytes (collation "C").
--   lease_epoch: a fencing epoch or counter: at least 1.
CREATE DOMAIN lease.lease_name AS text COLLATE "C"
    CONSTRAINT lease_name_size CHECK (pg_catalog.octet_length(VALUE) BETWEEN 1 AND 16384);
CREATE DOMAIN lease.lease_epoch AS bigint
    CONSTRAINT lease_epoch_positive CHECK (VALUE OPERATOR(pg_catalog.>=) 1);

-- Heartbeat groups (docs/SPECIFICATION.md §1.9): one owner's grants that
-- one row keeps alive, so that a worker holding a thousand keys writes one
-- row per heartbeat instead of a thousand (lease.join_group and
-- lease.renew_group). A grant in a group is live until the later of its own
-- expires_at and its group's (lease._live).
--   owner: the owner of every member; only that owner renews the group.
--   expires_at: extended by lease.renew_group while the group is live;
--          once passed it never moves again, so a lapsed group stays
--          lapsed.
--   members: how many grants still name the group. Every call that takes a
--          key out of a group (a release, a takeover, a force-release, a
--          move to another group) lowers it in the same transaction, so a
--          heartbeat that answers with the number it expects knows that no
--          member was lost.
--   id: drawn at random by lease.join_group, not from a sequence: a
--          sequence's position is not part of an extension's dump, so after
--          a restore it would hand out ids already in use.
CREATE TABLE lease.groups (
    id         bigint      PRIMARY KEY,
    owner      lease.lease_name NOT NULL,
    expires_at timestamptz NOT NULL,
    members    integer     NOT NULL
);
REVOKE ALL ON TABLE lease.groups FROM PUBLIC;

-- One row per key ever leased (and not pruned).
--   key_hash: SHA-256 of the key's UTF-8 bytes, the primary key. A btree
--          entry is limited to about 2.7 kB, so indexing the key itself
--          would refuse long keys; the digest keeps any key length working
--          at a fixed index width. Lookups compare the digest and then the
--          key.
--   owner/expires_at: the current or last grant; both NULL when FREE.
--   epoch: the key's fencing counter. It equals the current grant's epoch
--          while a grant exists (held or lapsed) and is one higher after a
--          release.
--   lapsed_owner: when the current grant took over a grant that had
--          lapsed, that grant's owner, so it hears `lapsed`
--          (docs/SPECIFICATION.md §1.3, rule 2).
--   first_epoch: the epoch of the row's first grant. A key whose row was
--          pruned comes back with a first grant above every epoch it had;
--          guards refuse epochs below first_epoch, which belong to a pruned
--          incarnation (docs/SPECIFICATION.md §1.8, I16).
--   group_id: the heartbeat group the current grant was joined to, or
--          NULL. Pruning clears it in the transaction that deletes the
--          group, and lease._live counts a group that is gone as lapsed, so
--          a member is never stuck. Not a foreign key: its trigger would
--          cost every write of the table about 5 µs (docs/PERFORMANCE.md),
--          and the group's only deleter keeps the rule.
--   force_released: true when the key's last release was an operator's
--          (lease.force_release), NULL when its holder released it or it
--          was never released. Read only while the row is FREE, to tell its
--          last holder which of the two ended its grant (lease.key_state);
--          a grant leaves it as it is, so that the common paths write
--          nothing more.
-- The domains and the constraint are the states that cannot happen. Names
-- are compared as bytes: lease.lease_name has collation "C".
CREATE TABLE lease.leases (
    key          lease.lease_name  NOT NULL,
    key_hash     bytea             PRIMARY KEY,
    owner        lease.lease_name,
    epoch        lease.lease_epoch NOT NULL,
    expires_at   timestamptz,
    lapsed_owner lease.lease_name,
    first_epoch  lease.lease_epoch NOT NULL,
    group_id     bigint,
    force_released boolean,
    -- A grant has an owner and an expiry, a FREE row neither; a heartbeat
    -- group, and the lapsed owner a takeover remembers, belong to a grant.
    -- One table constraint for all of it (see the domains above for why
    -- one). Not checked here, because each would cost every write: the
    -- key_hash is lease._key_hash(key) (every writer computes it with that
    -- one function), and first_epoch <= epoch (a counter only grows).
    -- Written as a CASE: PostgreSQL reads a CHECK back from its stored
    -- text at every statement that writes the table, so fewer nodes cost
    -- every write less (about 11,000 instructions against the three-term
    -- conjunction of the same rule).
    CONSTRAINT leases_grant_complete CHECK (
        CASE WHEN owner IS NULL THEN expires_at IS NULL AND group_id IS NULL AND lapsed_owner IS NULL
             ELSE expires_at IS NOT NULL END)
);
REVOKE ALL ON TABLE lease.leases FROM PUBLIC;
-- A group's members, for the namespace check of a heartbeat
-- (lease.renew_group) and the prune's clearing. Partial: grants
-- outside groups add no entry, and a renew, which changes no group_id,
-- stays a HOT update.
CREATE INDEX leases_group_id ON lease.leases (group_id) WHERE group_id IS NOT NULL;

-- Key namespaces (docs/SPECIFICATION.md §4): an operator binds a prefix of
-- key and resource names to a database role. A name is governed by the rule
-- with the longest prefix it starts with, and only members of that rule's
-- role (and superusers) may act on it. Without rules every role may act on
-- every name. Rules are written only by the operator functions.
--   prefix: not empty, at most 1024 bytes (a btree key).
--   role_oid, role_name: the bound role, by oid and by the name it had
--          when bound.
--   system_identifier: pg_control_system()'s identifier of the cluster
--          where role_oid was recorded. Its standbys share it, so a
--          failover keeps the oid's meaning; a dump restored elsewhere
--          does not, and there the oid means nothing.
-- Which role a rule admits (lease._rule_role): in the cluster that
-- recorded it, the role with that oid while it still has that name; a
-- role renamed, or dropped (and perhaps created again), fails closed:
-- nobody but superusers until an operator binds the prefix again. In
-- another cluster (a restored dump, whose roles were recreated by name
-- with new oids) the role named role_name, as PostgreSQL's own privileges
-- follow names across pg_dumpall and pg_restore; the first grant there
-- records that role's oid and this cluster's identifier
-- (lease._generation), so from then on the rule is held by oid again.
-- A rule whose name no role has fails closed (docs/SPECIFICATION.md §4).
CREATE TABLE lease.namespaces (
    prefix            text        COLLATE "C" PRIMARY KEY,
    role_oid          oid         NOT NULL,
    role_name         text        COLLATE "C" NOT NULL,
    created_at        timestamptz NOT NULL,
    system_identifier bigint      NOT NULL,
    CONSTRAINT namespaces_prefix_size CHECK (pg_catalog.octet_length(prefix) BETWEEN 1 AND 1024)
);
REVOKE ALL ON TABLE lease.namespaces FROM PUBLIC;

-- One row that every change of the namespace rules writes
-- (lease.bind_namespace, lease.unbind_namespace), so that a transaction
-- whose snapshot is older than a change can tell: under REPEATABLE READ or
-- SERIALIZABLE, lease._allowed locks this row FOR SHARE, which raises a
-- serialization failure (40001) when the row changed after the snapshot
-- (docs/SPECIFICATION.md §4). Not part of a dump: install writes it, and
-- its value means nothing in another cluster.
CREATE TABLE lease.namespace_changes (
    singleton  boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    changed_at timestamptz NOT NULL
);
REVOKE ALL ON TABLE lease.namespace_changes FROM PUBLIC;
INSERT INTO lease.namespace_changes (singleton, changed_at) VALUES (true, pg_catalog.clock_timestamp());

-- Generations (docs/SPECIFICATION.md §1.2, §1.7): what orders epochs across
-- a promotion, a restore onto a new timeline, and a dump restored into
-- another cluster.
--
-- The problem. A key's counter lives in lease.leases and travels by WAL. A
-- standby that is promoted before it received the old primary's last grants
-- has older counters, and would grant again epochs the old primary already
-- handed out: two holders with one epoch, and guards that cannot tell them
-- apart.
--
-- The fix. An epoch carries a generation in its high bits: a grant's epoch
-- is at least (generation << 40) + 1 (lease._grant_epoch). A server that
-- was never promoted or restored has generation 0, so its epochs are
-- exactly the counter + 1 (1, 2, 3, ...). The generation is
--
--   GREATEST(base + timeline - 1, external_floor)
--
-- where `timeline` is the server's current timeline: PostgreSQL gives every
-- promotion, and every archive recovery that ends with a promotion, a new
-- and higher timeline ID, and no server of a lineage writes on a timeline
-- before it was created. So every epoch the old primary granted on timeline
-- T is below (generation(T + 1) << 40) + 1, and the promoted server, now on
-- T + 1 or later, grants above all of them, including for keys it never saw.
--
-- Lineage. pg_dump copies this row into a cluster with a new system
-- identifier, whose timeline starts again at 1. The first grant (or
-- lease.raise_generation) that sees a system identifier other than the
-- row's starts a new lineage: its generation is one above every generation
-- the old lineage recorded (the row) or used (the highest generation of any
-- counter in lease.leases, and the prune watermark). Standbys and base
-- backups keep the system identifier, so they stay in the lineage and the
-- timeline orders them.
--
-- What it rests on: one promotion per timeline, which an HA manager gives
-- (it promotes one standby per failover). What breaks it: two standbys of
-- one primary both promoted, a restore that picks a timeline another branch
-- already used, and any split brain with two writable primaries.
--
-- Bounds: one key takes fewer than 2^40 grants plus releases within one
-- generation; the generation is at most 2^23 - 1 (lease._max_generation),
-- so epochs stay positive bigints.
--
-- Columns:
--   system_identifier: the lineage, pg_control_system()'s identifier of the
--          cluster that wrote the row last.
--   base: generation = base + timeline - 1 (install makes it 0 on the
--          install's timeline).
--   last_timeline: the highest timeline a grant has recorded (what a dump
--          carries into a new lineage). Recorded without waiting.
--   external_floor: the lowest generation an operator allows
--          (lease.raise_generation); 0 until raised.
--   pruned_through: the pruning watermark: at least the counter of every
--          key row ever pruned, so a never-seen key's first grant, at least
--          pruned_through + 1, is above every epoch a pruned key had. Only
--          raised.
--   checked_start: pg_postmaster_start_time() of the server that last
--          compared system_identifier with its own. The common grant
--          compares this value, which is in memory, instead of reading the
--          control file at every grant: a running server's identifier
--          cannot change, so a row whose checked_start is this server's
--          start time was checked by this server. A row any other server
--          wrote (a standby's replayed copy, a dump from another cluster,
--          a row from before a restart) sends the grant to the full
--          comparison. What it rests on: a dump restored into a cluster
--          whose server started in the same microsecond as the dumped one.
CREATE TABLE lease.lineage (
    singleton         boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    system_identifier bigint  NOT NULL,
    base              bigint  NOT NULL,
    last_timeline     bigint  NOT NULL,
    external_floor    bigint  NOT NULL DEFAULT 0,
    pruned_through    bigint  NOT NULL DEFAULT 0,
    checked_start     timestamptz,
    CONSTRAINT lineage_last_timeline CHECK (last_timeline OPERATOR(pg_catalog.>=) 1),
    CONSTRAINT lineage_external_floor CHECK (external_floor BETWEEN 0 AND 8388607),
    CONSTRAINT lineage_pruned_through CHECK (pruned_through OPERATOR(pg_catalog.>=) 0)
);
REVOKE ALL ON TABLE lease.lineage FROM PUBLIC;

-- One row per fenced resource (docs/SPECIFICATION.md §2).
--   resource_hash: SHA-256 of the resource name (see lease.leases.key_hash).
--   lease_key: the key whose epochs fence it (G5: other keys' tokens are a
--          misuse).
--   accepted_epoch: the record (G1): the highest epoch admitted, or one
--          more than the epoch lease.fence fenced through, whichever is
--          greater (a resource never admitted or fenced has no row). Never
--          decreases. Epochs below it are refused.
CREATE TABLE lease.guards (
    resource       lease.lease_name  NOT NULL,
    resource_hash  bytea             PRIMARY KEY,
    lease_key      lease.lease_name  NOT NULL,
    accepted_epoch lease.lease_epoch NOT NULL,
    updated_at     timestamptz       NOT NULL
);
REVOKE ALL ON TABLE lease.guards FROM PUBLIC;

-- One row per (key, listener session) with interest in the key's release
-- (the waiting protocol, sql/functions/04_waiting.sql).
--   backend_pid: the registering session. A stale row (its session gone,
--   or its pid reused) only costs an unneeded notification;
--   lease._waiter_reset prunes rows whose pid no longer runs in this
--   database.
CREATE TABLE lease.waiters (
    key_hash    bytea   NOT NULL,
    backend_pid integer NOT NULL,
    PRIMARY KEY (key_hash, backend_pid)
);
-- For the per-session cap and the per-session deletes.
CREATE INDEX waiters_backend_pid ON lease.waiters (backend_pid);
REVOKE ALL ON TABLE lease.waiters FROM PUBLIC;

-- One row per FREE key a prune has seen, for the idle time of FREE rows
-- (sql/functions/06_pruning.sql).
--   key_hash: the key's digest (lease.leases.key_hash).
--   epoch: the key's counter when the prune saw it FREE.
--   seen_at: when (clock_timestamp() of that prune).
CREATE TABLE lease.prune_sightings (
    key_hash bytea       PRIMARY KEY,
    epoch    bigint      NOT NULL,
    seen_at  timestamptz NOT NULL
);
REVOKE ALL ON TABLE lease.prune_sightings FROM PUBLIC;

-- The lineage of this installation: generation 0 on the timeline it is
-- installed on, so epochs start at 1. The timeline is the expression of
-- lease._timeline() (sql/functions/01_rules.sql), which does not exist yet
-- when the tables are created; tests/leasehold/sql_rules.rs keeps the two
-- equal.
INSERT INTO lease.lineage (singleton, system_identifier, base, last_timeline, external_floor, checked_start)
SELECT true, (pg_catalog.pg_control_system()).system_identifier, 1 OPERATOR(pg_catalog.-) t.timeline, t.timeline, 0,
       pg_catalog.pg_postmaster_start_time()
  FROM (SELECT CASE WHEN pg_catalog.pg_is_in_recovery()
                THEN (pg_catalog.pg_control_checkpoint()).timeline_id::bigint
                ELSE ('x' OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_insert_lsn()), 1, 8))::bit(32)::bigint
           END AS timeline) AS t;

-- Every migration ends so (see lease._drop_default_grants).
SELECT lease._drop_default_grants();
