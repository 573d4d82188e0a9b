-- leasehold: fenced tables (docs/SPECIFICATION.md §2.1). A fenced table
-- refuses every write (INSERT, UPDATE, DELETE, MERGE, COPY FROM, TRUNCATE)
-- of a transaction that did not present a current token of the key that
-- fences it, whatever client sends the write.
--
-- Presenting: lease.present(key, owner, epoch) appends the token's text
-- (lease._token_text) to the setting lease.presented, which is
-- transaction-local and starts with the transaction's id
-- (lease._claims_tag): it ends with the transaction, or with the savepoint
-- that presented it, and a value left at session level (by an earlier user
-- of a pooled connection, say) matches no later transaction. The setting
-- is a claim only. Each write statement looks the key's row up and admits
-- the write only if the grant is live and the claims of this transaction
-- contain exactly its (key, owner, epoch); the row is then locked FOR KEY
-- SHARE until the transaction ends (G6). So a forged claim, a stale token
-- or one of another key is refused like an absent one, and a substring
-- that happens to match can only name the current grant.
--
-- The fence is a set of statement triggers named lease_fence*, created by
-- lease.protect_table or lease.protect_rows as the calling role (who must
-- own the table) and enabled ALWAYS, so session_replication_role = replica
-- does not silence them; with them, a row trigger that never fires and a
-- CHECK keep the table fenceable against its owner's later DDL (F7). The
-- triggers' arguments are the whole configuration: the fence travels with
-- the table through pg_dump and pg_restore, and lease.fenced_tables reads
-- it back from pg_trigger.
--
-- Who runs what. The trigger function, lease._fence, is SECURITY INVOKER:
-- any role may attach it to a table of its own, with any arguments and
-- any temp objects in reach, so it must not run as the installing role.
-- It reads the keys the statement wrote and hands them to
-- lease._fence_check, the one SECURITY DEFINER step, which depends on
-- nothing the caller shapes: its arguments are plain values, it reads
-- only lease.* and pg_catalog by name, compares keys bytewise (COLLATE
-- "C") and applies the namespace rules to session_user before it reads a
-- lease row.

SET LOCAL lock_timeout = '5s';

-- Whether a column of type `type_oid` may be a row fence's key column:
-- an enum, or a type lease._fence_key_text has an overload for, directly
-- or as a domain's base type (integers, numeric, text types, uuid,
-- boolean). Their text form is the same in every session (dates, floats
-- and bytea follow DateStyle, extra_float_digits and bytea_output, so one
-- row could have two keys).
CREATE OR REPLACE FUNCTION lease._fence_key_type_ok(type_oid oid)
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_type oid := type_oid;
    v_row record;
BEGIN
    FOR v_depth IN 1..32 LOOP
        SELECT t.typtype, t.typbasetype INTO v_row FROM pg_type AS t WHERE t.oid = v_type;
        IF NOT FOUND THEN
            RETURN false;
        END IF;
        IF v_row.typtype = 'd' THEN
            v_type := v_row.typbasetype;
            CONTINUE;
        END IF;
        RETURN v_row.typtype = 'e'
            OR EXISTS (SELECT 1 FROM pg_proc AS p
                        WHERE p.pronamespace = 'lease'::regnamespace AND p.proname = '_fence_key_text'
                          AND p.proargtypes = ARRAY[v_type]::oidvector);
    END LOOP;
    RETURN false;
END;
$$;

-- Raised when a write to a fenced table is refused for a reason other than
-- the token's lease (which lease._raise_not_held words): no token of the
-- key in this transaction, a NULL key column, a TRUNCATE of a row fence.
-- `key` is NULL when the refusal is not about one key.
CREATE OR REPLACE FUNCTION lease._raise_write_refused(fenced_table text, why text, constraint_name text, key text,
                                                      hint text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'write to table % refused: %', fenced_table, why
        USING ERRCODE = '55000',
              CONSTRAINT = constraint_name,
              DETAIL = lease._detail('table', fenced_table, 'key', key),
              HINT = hint;
END;
$$;

-- Raised when a table cannot be protected or unprotected as asked.
CREATE OR REPLACE FUNCTION lease._raise_not_fenceable(caller text, fenced_table text, why text, constraint_name text,
                                                      hint text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'lease.% cannot fence table %: %', caller, fenced_table, why
        USING ERRCODE = CASE WHEN constraint_name = 'lease_table_not_owned' THEN '42501' ELSE '22023' END,
              CONSTRAINT = constraint_name,
              DETAIL = lease._detail('table', fenced_table, 'role', session_user::text),
              HINT = hint;
END;
$$;

-- The text of a presented token inside lease.presented: every field
-- prefixed by its length, so no token's text can be read as another's.
-- Inlined.
CREATE OR REPLACE FUNCTION lease._token_text(key text, owner text, epoch bigint)
RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT pg_catalog.format('%s:%s:%s:%s:%s;', pg_catalog.length(key), key, pg_catalog.length(owner), owner, epoch)
$$;

-- What lease.presented starts with when this transaction presented a
-- token: its transaction id and a space. Inlined.
CREATE OR REPLACE FUNCTION lease._claims_tag()
RETURNS text
LANGUAGE sql VOLATILE
AS $$ SELECT pg_catalog.textcat(pg_catalog.pg_current_xact_id()::pg_catalog.text, ' ') $$;

-- Whether this transaction presented the grant of lease row `l` and that
-- grant is live: THE admission test of a fenced table's write. Inlined.
CREATE OR REPLACE FUNCTION lease._presented_live(l lease.leases)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT lease._live(l)
       AND pg_catalog.starts_with(pg_catalog.current_setting('lease.presented', true), lease._claims_tag())
       AND pg_catalog.strpos(pg_catalog.current_setting('lease.presented', true),
                             lease._token_text((l).key, (l).owner, (l).epoch)) OPERATOR(pg_catalog.>) 0
$$;

-- Presents (key, owner, epoch) for this transaction's writes to the tables
-- that key fences; each write checks it (see the top of this file). The
-- namespace rules (§4) apply as to every call that names a key. The
-- setting is the session's, whoever sets it; the function's own SET clause
-- restores only search_path when it returns.
CREATE OR REPLACE FUNCTION lease.present(key text, owner text, epoch bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key text COLLATE "C" := key;
    v_owner text COLLATE "C" := owner;
    v_epoch bigint := epoch;
    v_tag text := lease._claims_tag();
    v_claims text := current_setting('lease.presented', true);
BEGIN
    IF (lease._name_ok(v_key) AND lease._name_ok(v_owner) AND v_epoch >= 1) IS NOT TRUE THEN
        PERFORM lease._raise_invalid('present',
            lease._text_violations('key', v_key) || lease._text_violations('owner', v_owner)
            || lease._epoch_violations('epoch', v_epoch, 1));
    END IF;
    IF NOT lease._allowed(v_key) THEN
        PERFORM lease._raise_forbidden('present', 'key', v_key);
    END IF;
    v_claims := set_config('lease.presented',
        CASE WHEN starts_with(v_claims, v_tag) THEN v_claims ELSE v_tag END || lease._token_text(v_key, v_owner, v_epoch),
        true);
END;
$$;

-- The (owner, epoch) this transaction presented last for `key`, read from
-- lease.presented; no row when it presented none. The refusal path only.
CREATE OR REPLACE FUNCTION lease._presented_token(key text, OUT owner text, OUT epoch bigint)
RETURNS SETOF record
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tag text := lease._claims_tag();
    v_claims text := current_setting('lease.presented', true);
    v_at integer;
    v_colon integer;
    v_length integer;
    v_key text;
    v_owner text;
    v_found boolean := false;
BEGIN
    IF NOT starts_with(v_claims, v_tag) THEN
        RETURN;
    END IF;
    v_at := length(v_tag) + 1;
    -- Each token: <length>:<key>:<length>:<owner>:<epoch>;
    WHILE v_at <= length(v_claims) LOOP
        v_colon := strpos(substr(v_claims, v_at), ':');
        EXIT WHEN v_colon = 0;
        v_length := substr(v_claims, v_at, v_colon - 1)::integer;
        v_key := substr(v_claims, v_at + v_colon, v_length);
        v_at := v_at + v_colon + v_length + 1;
        v_colon := strpos(substr(v_claims, v_at), ':');
        EXIT WHEN v_colon = 0;
        v_length := substr(v_claims, v_at, v_colon - 1)::integer;
        v_owner := substr(v_claims, v_at + v_colon, v_length);
        v_at := v_at + v_colon + v_length + 1;
        v_colon := strpos(substr(v_claims, v_at), ';');
        EXIT WHEN v_colon = 0;
        -- Only a token in the form lease.present writes counts, as on the
        -- admission path, which matches that form only.
        IF v_key = _presented_token.key
           AND substr(v_claims, v_at, v_colon - 1) ~ '^[1-9][0-9]{0,18}$'
           AND strpos(v_claims, lease._token_text(v_key, v_owner, substr(v_claims, v_at, v_colon - 1)::bigint)) > 0 THEN
            owner := v_owner;
            epoch := substr(v_claims, v_at, v_colon - 1)::bigint;
            v_found := true;
        END IF;
        v_at := v_at + v_colon;
    END LOOP;
    IF v_found THEN
        RETURN NEXT;
    END IF;
END;
$$;

-- Why the write to `fenced_table` under `key` is refused: no token of the
-- key in this transaction (the refusal names the key as `shown`), or the
-- lease is not held by the token presented (lease._check_held raises,
-- naming the table; the writer presented the key, so it knows it).
-- Returns only when the token does hold the lease after all (it was
-- granted in between); the row is then locked as the common path locks
-- it.
CREATE OR REPLACE FUNCTION lease._fence_refusal(fenced_table text, key text, shown text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_token record;
BEGIN
    SELECT * INTO v_token FROM lease._presented_token(key);
    IF NOT FOUND THEN
        PERFORM lease._raise_write_refused(fenced_table,
            format('no token of lease key %s was presented in this transaction', shown), 'lease_fence_no_token',
            shown,
            'In the writing transaction, first run SELECT lease.present(key, owner, epoch) with the token of the lease that fences the table.');
    END IF;
    PERFORM lease._check_held(key, v_token.owner, v_token.epoch, fenced_table);
END;
$$;

-- A row fence's key as a refusal may show it to the session: hidden when
-- the session's role may not read the row it was built from (no SELECT on
-- one of the key columns, or row security on the table that the role does
-- not bypass), as PostgreSQL keeps a refused row's values from a role
-- that may not read them. A whole-table fence's key is the table's
-- configuration, which lease.fenced_tables shows anyone. The refusal path
-- only.
CREATE OR REPLACE FUNCTION lease._fence_shown_key(fenced_table regclass, key text)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_args text[];
    v_rel record;
    v_role record;
BEGIN
    SELECT f.args INTO v_args FROM lease._fences() AS f WHERE f.tbl = fenced_table;
    IF v_args[1] IS DISTINCT FROM 'rows' THEN
        RETURN key;
    END IF;
    SELECT c.relrowsecurity, c.relforcerowsecurity, c.relowner INTO v_rel FROM pg_class AS c WHERE c.oid = fenced_table;
    SELECT r.rolsuper, r.rolbypassrls INTO v_role FROM pg_roles AS r WHERE r.rolname = session_user;
    IF (v_rel.relrowsecurity
        AND NOT (v_role.rolsuper OR v_role.rolbypassrls
                 OR (NOT v_rel.relforcerowsecurity AND pg_has_role(session_user, v_rel.relowner, 'USAGE'))))
       OR EXISTS (SELECT 1 FROM unnest(v_args[3:]) AS c
                   WHERE NOT has_column_privilege(session_user, fenced_table, c, 'SELECT')) THEN
        RETURN '(the key of a row this role may not read)';
    END IF;
    RETURN key;
END;
$$;

-- The text of one key column's value in a row fence's key: its type's
-- output, the same in every session. One function per type a key column
-- may have (through a domain, its base type), so this set of overloads is
-- THE list of those types (lease._fence_key_type_ok reads it): a column
-- whose type changed to one with a session-dependent text (a date under
-- DateStyle, say) finds no overload and the write fails. A cast to text
-- where it is the type's output and built in (cheaper per row than
-- format); format where a cast would differ (char drops its trailing
-- blanks, boolean says 'true') or could be a user's (an enum's owner may
-- create one). Inlined; granted to PUBLIC because the fence's trigger
-- runs as the writer.
CREATE OR REPLACE FUNCTION lease._fence_key_text(value smallint) RETURNS text LANGUAGE sql STABLE
AS $$ SELECT value::pg_catalog.text $$;
CREATE OR REPLACE FUNCTION lease._fence_key_text(value integer) RETURNS text LANGUAGE sql STABLE
AS $$ SELECT value::pg_catalog.text $$;
CREATE OR REPLACE FUNCTION lease._fence_key_text(value bigint) RETURNS text LANGUAGE sql STABLE
AS $$ SELECT value::pg_catalog.text $$;
CREATE OR REPLACE FUNCTION lease._fence_key_text(value numeric) RETURNS text LANGUAGE sql STABLE
AS $$ SELECT value::pg_catalog.text $$;
CREATE OR REPLACE FUNCTION lease._fence_key_text(value text) RETURNS text LANGUAGE sql STABLE
AS $$ SELECT value::pg_catalog.text $$;
CREATE OR REPLACE FUNCTION lease._fence_key_text(value character varying) RETURNS text LANGUAGE sql STABLE
AS $$ SELECT value::pg_catalog.text $$;
CREATE OR REPLACE FUNCTION lease._fence_key_text(value character) RETURNS text LANGUAGE sql STABLE
AS $$ SELECT pg_catalog.format('%s', value) $$;
CREATE OR REPLACE FUNCTION lease._fence_key_text(value name) RETURNS text LANGUAGE sql STABLE
AS $$ SELECT value::pg_catalog.text $$;
CREATE OR REPLACE FUNCTION lease._fence_key_text(value uuid) RETURNS text LANGUAGE sql STABLE
AS $$ SELECT value::pg_catalog.text $$;
CREATE OR REPLACE FUNCTION lease._fence_key_text(value boolean) RETURNS text LANGUAGE sql STABLE
AS $$ SELECT pg_catalog.format('%s', value) $$;
CREATE OR REPLACE FUNCTION lease._fence_key_text(value anyenum) RETURNS text LANGUAGE sql STABLE
AS $$ SELECT pg_catalog.format('%s', value) $$;

-- THE check of a write to a fenced table, given the keys the statement
-- wrote (NULL for a TRUNCATE of a row fence, which would remove every
-- key's rows; a NULL element for a row with a NULL key column). In order:
-- the input refusals, then the namespace rules (§4) on every key, so a
-- role outside a bound namespace gets the same refusal whether a key is
-- held, free or never leased; then one locking scan that admits the write
-- only if, for every key, the grant is live and this transaction presented
-- exactly its (key, owner, epoch); the rows stay locked FOR KEY SHARE
-- until the transaction ends (G6). A key it did not admit goes to
-- lease._fence_refusal, which says why.
--
-- SECURITY DEFINER (it reads lease.leases), and it depends on nothing but
-- its arguments, the rows of lease.*, the claims in lease.presented (which
-- it verifies against the rows) and session_user: any role may call it,
-- as a writer's trigger does, and learns no more than lease.check_held
-- would tell it. `fenced_table` names the table in refusals, and its
-- fence and privileges decide whether they show a row's key (the keys
-- passed in are the caller's own, so naming another table reveals none).
CREATE OR REPLACE FUNCTION lease._fence_check(fenced_table regclass, keys text[])
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_keys text[] COLLATE "C" := keys;
    v_key text COLLATE "C";
    v_admitted bigint;
BEGIN
    IF v_keys IS NULL THEN
        PERFORM lease._raise_write_refused(fenced_table::text,
            'TRUNCATE would remove the rows of every key of a row-fenced table', 'lease_fence_truncate', NULL,
            'DELETE the rows in a transaction that presented their keys'' tokens, or unprotect the table first.');
    END IF;
    IF array_position(v_keys, NULL) IS NOT NULL THEN
        PERFORM lease._raise_write_refused(fenced_table::text,
            'a written row has a NULL key column', 'lease_fence_null_key', NULL,
            'Give every key column of a row-fenced table a value (NOT NULL).');
    END IF;
    IF lease._any_rules() THEN
        SELECT k INTO v_key FROM unnest(v_keys) AS k WHERE NOT lease._allowed(k) LIMIT 1;
        IF FOUND THEN
            PERFORM lease._raise_forbidden('present', 'key', lease._fence_shown_key(fenced_table, v_key));
        END IF;
    END IF;
    SELECT count(*) INTO v_admitted
      FROM (SELECT 1
              FROM lease.leases AS l
             WHERE l.key_hash = ANY (ARRAY(SELECT lease._key_hash(k) FROM unnest(v_keys) AS k))
               AND l.key = ANY (v_keys) AND lease._presented_live(l)
               FOR KEY SHARE) AS l;
    IF v_admitted = cardinality(v_keys) THEN
        RETURN;
    END IF;
    FOREACH v_key IN ARRAY v_keys LOOP
        PERFORM lease._fence_refusal(fenced_table::text, v_key, lease._fence_shown_key(fenced_table, v_key));
    END LOOP;
END;
$$;

-- The trigger of a row fence. TG_ARGV is ('rows', key_prefix, column...),
-- ('shape') for the row trigger that keeps a fenced table's shape (it
-- never fires: WHEN false), or ('table', key) for a whole-table fence made
-- before lease._fence_table. A row fence reads the distinct keys of the
-- rows the statement wrote (for an UPDATE, before and after) from its
-- transition tables, each row's key text built from its own values and
-- compared bytewise, so values that are equal but print differently
-- (numeric 1 and 1.0, char 'a' and 'a ') are checked under the keys they
-- have; in a key of several columns, every column but the last escapes
-- '%' as %25 and '/' as %2F, so rows of different values never share a
-- key. lease._fence_check decides.
--
-- SECURITY INVOKER: it runs as the writer and reads only the writer's own
-- statement, so a role that attaches it to a table of its own, without
-- transition tables or with a temp relation named like them, only runs
-- its own code as itself. Its pinned search_path keeps the writer's
-- functions and operators out of the key's text.
CREATE OR REPLACE FUNCTION lease._fence()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key text;
    v_null text;
    v_keys text[];
BEGIN
    IF TG_ARGV[0] = 'table' THEN
        -- A whole-table fence made before lease._fence_table existed.
        PERFORM lease._fence_check(TG_RELID, ARRAY[TG_ARGV[1]]);
        RETURN NULL;
    END IF;
    IF TG_ARGV[0] <> 'rows' THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'TRUNCATE' THEN
        PERFORM lease._fence_check(TG_RELID, NULL);
    END IF;
    -- Every column's text but the last escapes '%' and '/', so the '/'
    -- between columns is the only one: ('x/y', 'z') and ('x', 'y/z') have
    -- two keys, x%2Fy/z and x/y/z.
    FOR v_at IN 2 .. TG_NARGS - 1 LOOP
        v_key := concat_ws(' || ''/'' || ', v_key,
            format(CASE WHEN v_at < TG_NARGS - 1
                        THEN 'pg_catalog.replace(pg_catalog.replace(lease._fence_key_text(r.%I), '
                             '''%%'', ''%%25''), ''/'', ''%%2F'')'
                        ELSE 'lease._fence_key_text(r.%I)' END, TG_ARGV[v_at]));
        v_null := concat_ws(' OR ', v_null, format('r.%I IS NULL', TG_ARGV[v_at]));
    END LOOP;
    EXECUTE format('SELECT array_agg(DISTINCT CASE WHEN %s THEN NULL ELSE ($1 || %s) COLLATE "C" END) FROM (%s) AS r',
                   v_null, v_key,
                   CASE TG_OP WHEN 'INSERT' THEN 'SELECT * FROM lease_new'
                              WHEN 'DELETE' THEN 'SELECT * FROM lease_old'
                              ELSE 'SELECT * FROM lease_old UNION ALL SELECT * FROM lease_new' END)
       INTO v_keys
      USING TG_ARGV[1];
    IF v_keys IS NOT NULL THEN
        PERFORM lease._fence_check(TG_RELID, v_keys);
    END IF;
    RETURN NULL;
END;
$$;

-- The trigger of a whole-table fence: TG_ARGV is (key). The check of
-- lease._fence_check for one key, inlined because a whole-table fence has
-- no rows to read: one call fewer on every write.
--
-- SECURITY DEFINER, and it depends on nothing the caller shapes: it reads
-- no relation of the table it fires on and nothing but TG_ARGV[0], a
-- value it checks like any key (namespace rules first), and TG_RELID, which
-- only names the table in a refusal. A role that attaches it to a table
-- of its own learns no more than lease.check_held would tell it.
CREATE OR REPLACE FUNCTION lease._fence_table()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key text COLLATE "C" := TG_ARGV[0];
BEGIN
    IF NOT lease._allowed(v_key) THEN
        PERFORM lease._raise_forbidden('present', 'key', v_key);
    END IF;
    PERFORM FROM lease.leases AS l
     WHERE l.key_hash = lease._key_hash(v_key) AND l.key = v_key AND lease._presented_live(l)
       FOR KEY SHARE;
    IF NOT FOUND THEN
        PERFORM lease._fence_refusal(TG_RELID::regclass::text, v_key, v_key);
    END IF;
    RETURN NULL;
END;
$$;

-- A fence's configuration from its trigger's tgargs (each argument's bytes
-- followed by a NUL): ('table', key) or ('rows', key_prefix, column...).
CREATE OR REPLACE FUNCTION lease._fence_args(tgargs bytea)
RETURNS text[]
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_args text[] := ARRAY[]::text[];
    v_rest bytea := tgargs;
    v_at integer;
BEGIN
    LOOP
        v_at := position(E'\\x00'::bytea IN v_rest);
        EXIT WHEN v_at = 0;
        v_args := v_args || convert_from(substr(v_rest, 1, v_at - 1), 'UTF8');
        v_rest := substr(v_rest, v_at + 1);
    END LOOP;
    RETURN v_args;
END;
$$;

-- Everything a change of `fenced_table`'s fence checks before the calling
-- role makes it: the input (key for protect_table; key_prefix, which may
-- be empty, and key_columns for protect_rows), that the session's role
-- owns the table (or is a member of its owner), that it is a plain table
-- (a partition or an inheritance child is written past its parent's
-- statement triggers), that the key columns exist and have a settled text
-- form, the namespace rules (§4) on the key or prefix, and that a fence
-- the table already has is the one asked for (protecting again completes
-- it; another one needs unprotect first). A row fence's keys may land
-- under any rule that extends its prefix, so while some rule shuts the
-- caller out, a prefix must lie under a rule of the caller's own. The
-- answer never depends on which rules extend the prefix: that would let
-- anyone spell out the bound prefixes byte by byte. The rules themselves
-- are applied to every key at every write.
CREATE OR REPLACE FUNCTION lease._fence_prepare(caller text, fenced_table regclass, key text, key_columns text[])
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_table regclass := fenced_table;
    v_key text COLLATE "C" := key;
    v_columns text[] := key_columns;
    v_rows boolean := caller = 'protect_rows';
    v_rel record;
    v_column text;
    v_type oid;
    v_current text[];
BEGIN
    IF v_table IS NULL
       OR (caller = 'protect_table' AND NOT lease._name_ok(v_key))
       OR (v_rows AND (v_key IS NULL OR octet_length(v_key) > 1024 OR v_columns IS NULL
                       OR cardinality(v_columns) NOT BETWEEN 1 AND 32
                       OR array_position(v_columns, NULL) IS NOT NULL)) THEN
        PERFORM lease._raise_invalid(caller,
            CASE WHEN v_table IS NULL THEN ARRAY['table must not be NULL'] ELSE ARRAY[]::text[] END
            || CASE WHEN caller = 'protect_table' THEN lease._text_violations('key', v_key)
                    WHEN NOT v_rows THEN ARRAY[]::text[]
                    WHEN v_key IS NULL THEN ARRAY['key_prefix must not be NULL']
                    WHEN octet_length(v_key) > 1024 THEN ARRAY['key_prefix must be at most 1024 bytes']
                    ELSE ARRAY[]::text[] END
            || CASE WHEN v_rows AND (v_columns IS NULL OR cardinality(v_columns) NOT BETWEEN 1 AND 32
                                     OR array_position(v_columns, NULL) IS NOT NULL)
                    THEN ARRAY['key_columns must name 1 to 32 columns'] ELSE ARRAY[]::text[] END);
    END IF;
    SELECT c.relkind, c.relowner, c.relispartition INTO v_rel FROM pg_class AS c WHERE c.oid = v_table;
    IF NOT FOUND OR NOT pg_has_role(session_user, v_rel.relowner, 'MEMBER') THEN
        PERFORM lease._raise_not_fenceable(caller, v_table::text,
            format('role %s does not own it', session_user), 'lease_table_not_owned',
            'Connect as the table''s owner, or as a member of the owning role.');
    END IF;
    IF caller = 'unprotect_table' THEN
        RETURN;
    END IF;
    IF v_rel.relkind <> 'r' OR v_rel.relispartition
       OR EXISTS (SELECT 1 FROM pg_inherits AS i WHERE i.inhrelid = v_table OR i.inhparent = v_table) THEN
        PERFORM lease._raise_not_fenceable(caller, v_table::text,
            'only a plain table without partitions or inheritance can be fenced', 'lease_table_not_fenceable',
            'Fence a plain table.');
    END IF;
    FOREACH v_column IN ARRAY CASE WHEN v_rows THEN v_columns ELSE ARRAY[]::text[] END LOOP
        SELECT a.atttypid INTO v_type FROM pg_attribute AS a
         WHERE a.attrelid = v_table AND a.attname = v_column AND a.attnum > 0 AND NOT a.attisdropped;
        IF NOT FOUND THEN
            PERFORM lease._raise_invalid(caller, ARRAY[format('key_columns: table %s has no column %s', v_table, v_column)]);
        END IF;
        IF NOT lease._fence_key_type_ok(v_type) THEN
            PERFORM lease._raise_invalid(caller, ARRAY[format(
                'key_columns: column %s has type %s, whose text depends on session settings; '
                'key columns must be integers, numeric, text, uuid, boolean or enums', v_column, format_type(v_type, NULL))]);
        END IF;
    END LOOP;
    IF NOT lease._allowed(v_key)
       OR (v_rows AND lease._any_rules()
           AND NOT EXISTS (SELECT 1 FROM lease.namespaces AS n WHERE starts_with(v_key, n.prefix))
           AND EXISTS (SELECT 1 FROM lease.namespaces AS n WHERE NOT lease._allowed(n.prefix))) THEN
        PERFORM lease._raise_forbidden(caller, CASE WHEN v_rows THEN 'key_prefix' ELSE 'key' END, v_key);
    END IF;
    SELECT f.args INTO v_current FROM lease._fences() AS f WHERE f.tbl = v_table;
    IF FOUND AND v_current IS DISTINCT FROM
                 (CASE WHEN v_rows THEN ARRAY['rows', v_key] || v_columns ELSE ARRAY['table', v_key] END) THEN
        PERFORM lease._raise_not_fenceable(caller, v_table::text,
            format('it is already fenced (%s)', array_to_string(v_current, ' ')), 'lease_table_already_fenced',
            'Run lease.unprotect_table first; in the same transaction, no write slips between the two fences.');
    END IF;
END;
$$;

-- The names of the parts of a fence besides its statement triggers, which
-- keep the table what a fence requires (§2.1, F7). Their names are what
-- PostgreSQL's refusal of a change quotes, so they say what to do.
CREATE OR REPLACE FUNCTION lease._fence_shape_trigger()
RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 'lease_fence_shape (lease.unprotect_table first)' $$;
CREATE OR REPLACE FUNCTION lease._fence_no_children_check()
RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 'lease_fence_no_children (lease.unprotect_table first)' $$;

-- Drops `fenced_table`'s fence, as the calling role: its lease_fence
-- triggers and its shape check; whether it had any.
CREATE OR REPLACE FUNCTION lease._fence_drop(fenced_table regclass)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_name name;
    v_found boolean := false;
BEGIN
    FOR v_name IN
        SELECT t.tgname FROM pg_trigger AS t
         WHERE t.tgrelid = fenced_table AND t.tgfoid IN ('lease._fence()'::regprocedure, 'lease._fence_table()'::regprocedure)
    LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', v_name, fenced_table);
        v_found := true;
    END LOOP;
    IF EXISTS (SELECT 1 FROM pg_constraint AS c
                WHERE c.conrelid = fenced_table AND c.conname = lease._fence_no_children_check()) THEN
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', fenced_table, lease._fence_no_children_check());
    END IF;
    RETURN v_found;
END;
$$;

-- Adds to `fenced_table`'s fence what keeps the table fenceable (F7), as
-- the calling role. A row trigger with a transition table, which never
-- fires (WHEN false): PostgreSQL then refuses to make the table a
-- partition or an inheritance child, and its WHEN names the key columns,
-- so their types cannot be altered or the columns dropped. A CHECK that
-- every row is the table's own (tableoid), inherited by any child, so a
-- child of the fenced table cannot hold a row; NOT VALID, because every
-- row the table has is its own.
CREATE OR REPLACE FUNCTION lease._fence_shape(fenced_table regclass, key_columns text[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    EXECUTE format('CREATE TRIGGER %I AFTER DELETE ON %s REFERENCING OLD TABLE AS lease_shape '
                   'FOR EACH ROW WHEN (false%s) EXECUTE FUNCTION lease._fence(''shape'')',
                   lease._fence_shape_trigger(), fenced_table,
                   (SELECT ' AND (' || string_agg(format('OLD.%I IS NULL', c), ' OR ') || ')'
                      FROM unnest(key_columns) AS c));
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER %I', fenced_table, lease._fence_shape_trigger());
    EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I CHECK (tableoid = %L::regclass) NOT VALID',
                   fenced_table, lease._fence_no_children_check(), fenced_table::oid::regclass::text);
END;
$$;

-- Fences the whole table `fenced_table` by `key`: a write needs a token of
-- `key`. Protecting again with the same key completes the fence; another
-- key is refused until the table is unprotected. Run as the table's owner:
-- the triggers are created with the caller's rights.
CREATE OR REPLACE FUNCTION lease.protect_table(fenced_table regclass, key text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_table regclass := fenced_table;
    v_key text COLLATE "C" := key;
BEGIN
    PERFORM lease._fence_prepare('protect_table', v_table, v_key, NULL);
    PERFORM lease._fence_drop(v_table);
    EXECUTE format('CREATE TRIGGER lease_fence BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON %s '
                   'FOR EACH STATEMENT EXECUTE FUNCTION lease._fence_table(%L)', v_table, v_key);
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER lease_fence', v_table);
    PERFORM lease._fence_shape(v_table, NULL);
END;
$$;

-- Fences each row of `fenced_table` by the key key_prefix || its
-- key_columns' values joined by '/', so writers of different keys do not
-- serialise. Protecting again with the same prefix and columns completes
-- the fence; another is refused until the table is unprotected. Run as the
-- table's owner.
CREATE OR REPLACE FUNCTION lease.protect_rows(fenced_table regclass, key_prefix text, key_columns text[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_table regclass := fenced_table;
    v_prefix text COLLATE "C" := key_prefix;
    v_columns text[] := key_columns;
    v_args text;
BEGIN
    PERFORM lease._fence_prepare('protect_rows', v_table, v_prefix, v_columns);
    PERFORM lease._fence_drop(v_table);
    SELECT string_agg(quote_literal(c), ', ') INTO v_args FROM unnest(ARRAY['rows', v_prefix] || v_columns) AS c;
    EXECUTE format('CREATE TRIGGER lease_fence_insert AFTER INSERT ON %s REFERENCING NEW TABLE AS lease_new '
                   'FOR EACH STATEMENT EXECUTE FUNCTION lease._fence(%s)', v_table, v_args);
    EXECUTE format('CREATE TRIGGER lease_fence_update AFTER UPDATE ON %s REFERENCING OLD TABLE AS lease_old '
                   'NEW TABLE AS lease_new FOR EACH STATEMENT EXECUTE FUNCTION lease._fence(%s)', v_table, v_args);
    EXECUTE format('CREATE TRIGGER lease_fence_delete AFTER DELETE ON %s REFERENCING OLD TABLE AS lease_old '
                   'FOR EACH STATEMENT EXECUTE FUNCTION lease._fence(%s)', v_table, v_args);
    EXECUTE format('CREATE TRIGGER lease_fence_truncate BEFORE TRUNCATE ON %s '
                   'FOR EACH STATEMENT EXECUTE FUNCTION lease._fence(%s)', v_table, v_args);
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER lease_fence_insert, '
                   'ENABLE ALWAYS TRIGGER lease_fence_update, ENABLE ALWAYS TRIGGER lease_fence_delete, '
                   'ENABLE ALWAYS TRIGGER lease_fence_truncate', v_table);
    PERFORM lease._fence_shape(v_table, v_columns);
END;
$$;

-- Removes `fenced_table`'s fence; whether it had one. Run as its owner.
CREATE OR REPLACE FUNCTION lease.unprotect_table(fenced_table regclass)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM lease._fence_prepare('unprotect_table', fenced_table, NULL, NULL);
    RETURN lease._fence_drop(fenced_table);
END;
$$;

-- Every fence's table and configuration, read from the trigger that
-- carries it: ('table', key) or ('rows', key_prefix, column...).
CREATE OR REPLACE FUNCTION lease._fences(OUT tbl regclass, OUT args text[])
RETURNS SETOF record
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT t.tgrelid::regclass,
           CASE WHEN t.tgfoid = 'lease._fence_table()'::regprocedure THEN ARRAY['table'] ELSE ARRAY[]::text[] END
           || lease._fence_args(t.tgargs)
      FROM pg_trigger AS t
     WHERE t.tgname IN ('lease_fence', 'lease_fence_insert')
       AND t.tgfoid IN ('lease._fence()'::regprocedure, 'lease._fence_table()'::regprocedure)
$$;

-- Every fenced table of the database: the key of a whole-table fence, or
-- the prefix and columns of a row fence.
CREATE OR REPLACE FUNCTION lease.fenced_tables()
RETURNS TABLE (fenced_table text, kind text, key text, key_prefix text, key_columns text[])
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT f.tbl::text, f.args[1],
           CASE WHEN f.args[1] = 'table' THEN f.args[2] END,
           CASE WHEN f.args[1] = 'rows' THEN f.args[2] END,
           CASE WHEN f.args[1] = 'rows' THEN f.args[3:] END
      FROM lease._fences() AS f
     ORDER BY 1
$$;

REVOKE ALL ON FUNCTION lease._fence_key_type_ok(oid) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._raise_write_refused(text, text, text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._raise_not_fenceable(text, text, text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._presented_token(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._fence_refusal(text, text, text), lease._fence_shown_key(regclass, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._presented_live(lease.leases) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._token_text(text, text, bigint), lease._claims_tag() FROM PUBLIC;
-- The protecting functions run as their caller, whose rights
-- create the triggers; _fence_prepare checks that caller itself. A table's
-- owner needs EXECUTE on the trigger function to create the triggers, and
-- the trigger runs as the writer, who needs EXECUTE on what it calls: the
-- check, which trusts only its arguments, and the key text overloads.
GRANT EXECUTE ON FUNCTION lease._fence_prepare(text, regclass, text, text[]) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease._fence_drop(regclass) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease._fence_shape(regclass, text[]) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease._fence_shape_trigger(), lease._fence_no_children_check() TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease._fence(), lease._fence_table() TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease._fence_check(regclass, text[]) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease._fence_key_text(smallint), lease._fence_key_text(integer),
    lease._fence_key_text(bigint), lease._fence_key_text(numeric), lease._fence_key_text(text),
    lease._fence_key_text(character varying), lease._fence_key_text(character), lease._fence_key_text(name),
    lease._fence_key_text(uuid), lease._fence_key_text(boolean), lease._fence_key_text(anyenum) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease._fence_args(bytea), lease._fences() TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.present(text, text, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.protect_table(regclass, text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.protect_rows(regclass, text, text[]) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.unprotect_table(regclass) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.fenced_tables() TO PUBLIC;

-- Every file of functions and every migration ends so (see
-- lease._drop_default_grants).
SELECT lease._drop_default_grants();
