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
-- does not silence them. Their arguments are the whole configuration: the
-- fence travels with the table through pg_dump and pg_restore, and
-- lease.fenced_tables reads it back from pg_trigger.
--
-- The trigger function is SECURITY DEFINER (it reads lease.leases) and
-- evaluates nothing a writer or the table's owner defined: a row's key is
-- built from its columns' text output (format('%s'), never a cast, so no
-- user-defined cast runs), and only types whose text does not depend on
-- session settings may be key columns (lease._fence_key_type_ok).

SET LOCAL lock_timeout = '5s';

-- The key columns a row-fenced table may use: integers, numeric, text
-- types, uuid, boolean, enums, and domains over them. Their text form is
-- the same in every session (dates, floats and bytea follow DateStyle,
-- extra_float_digits and bytea_output, so one row could have two keys).
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
            OR v_type IN ('int2'::regtype, 'int4'::regtype, 'int8'::regtype, 'numeric'::regtype,
                          'text'::regtype, 'varchar'::regtype, 'bpchar'::regtype, 'name'::regtype,
                          'uuid'::regtype, 'bool'::regtype);
    END LOOP;
    RETURN false;
END;
$$;

-- Raised when a write to a fenced table is refused for a reason other than
-- the token's lease (which lease._raise_not_held words): no token of the
-- key in this transaction, a NULL key column, a TRUNCATE of a row fence.
CREATE OR REPLACE FUNCTION lease._raise_write_refused(fenced_table text, why text, constraint_name text, detail text,
                                                      hint text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'write to table % refused: %', fenced_table, why
        USING ERRCODE = '55000',
              CONSTRAINT = constraint_name,
              DETAIL = format('table=%s', fenced_table) || COALESCE(' ' || detail, ''),
              HINT = hint;
END;
$$;

-- Raised when a table cannot be protected or unprotected as asked.
CREATE OR REPLACE FUNCTION lease._raise_not_fenceable(caller text, fenced_table text, why text, constraint_name text,
                                                      hint text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'lease.% cannot fence table %: %', caller, fenced_table, why
        USING ERRCODE = CASE WHEN constraint_name = 'lease_table_not_owned' THEN '42501' ELSE '22023' END,
              CONSTRAINT = constraint_name,
              DETAIL = format('table=%s', fenced_table),
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
    IF NOT (lease._name_ok(v_key) AND lease._name_ok(v_owner) AND v_epoch >= 1) THEN
        PERFORM lease._raise_invalid('present',
            lease._text_violations('key', v_key) || lease._text_violations('owner', v_owner)
            || lease._epoch_violations('epoch', v_epoch, 1));
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
        IF v_key = _presented_token.key THEN
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
-- key in this transaction, or the lease is not held by the token presented
-- (lease._check_held raises, naming the table). Returns only when the
-- token does hold the lease after all (it was granted in between); the
-- row is then locked as the common path locks it.
CREATE OR REPLACE FUNCTION lease._fence_refusal(fenced_table text, key text)
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
            format('no token of lease key %s was presented in this transaction', key), 'lease_fence_no_token',
            'key=' || key,
            'In the writing transaction, first run SELECT lease.present(key, owner, epoch) with the token of the lease that fences the table.');
    END IF;
    PERFORM lease._check_held(key, v_token.owner, v_token.epoch, fenced_table);
END;
$$;

-- The trigger of every fence. TG_ARGV is ('table', key) for a whole-table
-- fence, ('rows', key_prefix, column...) for a row fence. A row fence reads
-- the distinct keys of the rows the statement wrote (for an UPDATE, before
-- and after) from the transition tables; a row with a NULL key column is
-- refused, and so is TRUNCATE, which would remove every key's rows at once.
-- Then one statement checks every key (see the top of this file), and a key
-- it did not admit goes to lease._fence_refusal, which says why.
CREATE OR REPLACE FUNCTION lease._fence()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_keys text[];
    v_key text;
    v_null text;
    v_columns text;
    v_nulls boolean;
    v_admitted text[];
BEGIN
    IF TG_ARGV[0] = 'table' THEN
        PERFORM FROM lease.leases AS l
         WHERE l.key_hash = lease._key_hash(TG_ARGV[1]) AND l.key = TG_ARGV[1] AND lease._presented_live(l)
           FOR KEY SHARE;
        IF NOT FOUND THEN
            PERFORM lease._fence_refusal(format('%I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME), TG_ARGV[1]);
        END IF;
        RETURN NULL;
    END IF;
    IF TG_OP = 'TRUNCATE' THEN
        PERFORM lease._raise_write_refused(format('%I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME),
            'TRUNCATE would remove the rows of every key of a row-fenced table', 'lease_fence_truncate', NULL,
            'DELETE the rows in a transaction that presented their keys'' tokens, or unprotect the table first.');
    END IF;
    SELECT string_agg(format('format(''%%s'', r.%I)', c), ' || ''/'' || '),
           string_agg(format('r.%I IS NULL', c), ' OR '),
           string_agg(format('%I', c), ', ')
      INTO v_key, v_null, v_columns
      FROM unnest(TG_ARGV[2:]) AS c;
    -- Distinct column values first: the key text is built once per key,
    -- not once per row.
    EXECUTE format('SELECT array_agg($1 || %s) FILTER (WHERE NOT (%s)), COALESCE(bool_or(%s), false) '
                   'FROM (SELECT DISTINCT %s FROM (%s) AS w) AS r',
                   v_key, v_null, v_null, v_columns,
                   CASE TG_OP WHEN 'INSERT' THEN 'SELECT * FROM lease_new'
                              WHEN 'DELETE' THEN 'SELECT * FROM lease_old'
                              ELSE 'SELECT * FROM lease_old UNION ALL SELECT * FROM lease_new' END)
       INTO v_keys, v_nulls
      USING TG_ARGV[1];
    IF v_nulls THEN
        PERFORM lease._raise_write_refused(format('%I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME),
            'a written row has a NULL key column', 'lease_fence_null_key', NULL,
            'Give every key column of a row-fenced table a value (NOT NULL).');
    END IF;
    IF v_keys IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT array_agg(l.key) INTO v_admitted
      FROM (SELECT l.key
              FROM lease.leases AS l
             WHERE l.key_hash = ANY (ARRAY(SELECT lease._key_hash(k) FROM unnest(v_keys) AS k))
               AND l.key = ANY (v_keys) AND lease._presented_live(l)
               FOR KEY SHARE) AS l;
    IF cardinality(v_admitted) IS DISTINCT FROM cardinality(v_keys) THEN
        FOREACH v_key IN ARRAY v_keys LOOP
            IF v_admitted IS NULL OR NOT v_key = ANY (v_admitted) THEN
                PERFORM lease._fence_refusal(format('%I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME), v_key);
            END IF;
        END LOOP;
    END IF;
    RETURN NULL;
END;
$$;

-- Everything a change of `fenced_table`'s fence checks before the calling
-- role makes it: the input (key for protect_table; key_prefix, which may
-- be empty, and key_columns for protect_rows), that the session's role
-- owns the table (or is a member of its owner), that it is a plain table
-- (a partition or an inheritance child is written past its parent's
-- statement triggers), that the key columns exist and have a settled text
-- form, and the namespace rules (§4) on the key or prefix.
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
    IF caller <> 'unprotect_table' AND v_key <> '' AND NOT lease._allowed(v_key) THEN
        PERFORM lease._raise_forbidden(caller, CASE WHEN v_rows THEN 'key_prefix' ELSE 'key' END, v_key);
    END IF;
END;
$$;

-- Drops `fenced_table`'s lease_fence triggers, as the calling role; whether
-- there were any.
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
         WHERE t.tgrelid = fenced_table AND t.tgfoid = 'lease._fence()'::regprocedure
    LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', v_name, fenced_table);
        v_found := true;
    END LOOP;
    RETURN v_found;
END;
$$;

-- Fences the whole table `fenced_table` by `key`: a write needs a token of
-- `key`. Replaces any fence the table had. Run as the table's owner: the
-- triggers are created with the caller's rights.
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
                   'FOR EACH STATEMENT EXECUTE FUNCTION lease._fence(''table'', %L)', v_table, v_key);
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER lease_fence', v_table);
END;
$$;

-- Fences each row of `fenced_table` by the key key_prefix || its
-- key_columns' values joined by '/', so writers of different keys do not
-- serialise. Replaces any fence the table had. Run as the table's owner.
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

-- Every fenced table of the database, read from its triggers: the key of a
-- whole-table fence, or the prefix and columns of a row fence.
CREATE OR REPLACE FUNCTION lease.fenced_tables()
RETURNS TABLE (fenced_table text, kind text, key text, key_prefix text, key_columns text[])
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_trigger record;
    v_args text[];
    v_rest bytea;
    v_at integer;
BEGIN
    FOR v_trigger IN
        SELECT t.tgrelid::regclass::text AS tbl, t.tgargs
          FROM pg_trigger AS t
         WHERE t.tgname IN ('lease_fence', 'lease_fence_insert') AND t.tgfoid = 'lease._fence()'::regprocedure
         ORDER BY 1
    LOOP
        -- tgargs: each argument's bytes followed by a NUL.
        v_args := ARRAY[]::text[];
        v_rest := v_trigger.tgargs;
        LOOP
            v_at := position('\x00'::bytea IN v_rest);
            EXIT WHEN v_at = 0;
            v_args := v_args || convert_from(substr(v_rest, 1, v_at - 1), 'UTF8');
            v_rest := substr(v_rest, v_at + 1);
        END LOOP;
        fenced_table := v_trigger.tbl;
        kind := v_args[1];
        key := CASE WHEN kind = 'table' THEN v_args[2] END;
        key_prefix := CASE WHEN kind = 'rows' THEN v_args[2] END;
        key_columns := CASE WHEN kind = 'rows' THEN v_args[3:] END;
        RETURN NEXT;
    END LOOP;
END;
$$;

REVOKE ALL ON FUNCTION lease._fence_key_type_ok(oid) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._raise_write_refused(text, text, text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._raise_not_fenceable(text, text, text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._presented_token(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._fence_refusal(text, text) FROM PUBLIC;
-- The protecting functions run as their caller, whose rights create the
-- triggers; _fence_prepare checks that caller itself. A table's owner needs
-- EXECUTE on the trigger function to create the triggers; it runs only as
-- a trigger.
REVOKE ALL ON FUNCTION lease._presented_live(lease.leases) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._token_text(text, text, bigint), lease._claims_tag() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lease._fence_prepare(text, regclass, text, text[]) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease._fence_drop(regclass) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease._fence() TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.present(text, text, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.protect_table(regclass, text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.protect_rows(regclass, text, text[]) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.unprotect_table(regclass) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.fenced_tables() TO PUBLIC;

-- Every file of functions and every migration ends so (see
-- lease._drop_default_grants).
SELECT lease._drop_default_grants();
