-- leasehold: what ends every script of the extension, after the
-- migrations and the files of functions (src/admin/extension.rs adds it).

-- Extension only (generated): pg_dump keeps the rows of every table but
-- lease.waiters (session state) and lease.namespace_changes (a marker whose
-- value means nothing in another cluster).
DO $$
DECLARE
    v_table pg_catalog.regclass;
BEGIN
    FOR v_table IN
        SELECT c.oid::pg_catalog.regclass
          FROM pg_catalog.pg_depend AS d
          JOIN pg_catalog.pg_class AS c ON c.oid OPERATOR(pg_catalog.=) d.objid
          JOIN pg_catalog.pg_extension AS e ON e.oid OPERATOR(pg_catalog.=) d.refobjid
         WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
           AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
           AND d.deptype OPERATOR(pg_catalog.=) 'e'
           AND e.extname OPERATOR(pg_catalog.=) 'leasehold'
           AND c.relkind OPERATOR(pg_catalog.=) 'r'
           AND c.relname OPERATOR(pg_catalog.<>) ALL (ARRAY['waiters', 'namespace_changes']::pg_catalog.name[])
         ORDER BY c.oid
    LOOP
        PERFORM pg_catalog.pg_extension_config_dump(v_table, '');
    END LOOP;
END
$$;

-- Extension only (generated): on restore, the dump's lineage row replaces
-- the one CREATE EXTENSION inserted, so the dump keeps its lineage. It
-- merges, never lowers: the generation floor becomes at least the
-- generation the row already there gives now, and the pruning watermark
-- the higher of the two, so an INSERT outside a restore loses nothing.
CREATE OR REPLACE FUNCTION lease._lineage_restore()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_old lease.lineage;
BEGIN
    SELECT g.* INTO v_old FROM lease.lineage AS g WHERE g.singleton FOR UPDATE;
    IF FOUND THEN
        NEW.external_floor := LEAST(lease._max_generation(),
                                    GREATEST(NEW.external_floor, v_old.external_floor,
                                             lease._lineage_generation(v_old, lease._timeline())));
        NEW.pruned_through := GREATEST(NEW.pruned_through, v_old.pruned_through);
        DELETE FROM lease.lineage AS g WHERE g.singleton;
    END IF;
    RETURN NEW;
END;
$$;
REVOKE ALL ON FUNCTION lease._lineage_restore() FROM PUBLIC;
CREATE OR REPLACE TRIGGER lineage_restore
BEFORE INSERT ON lease.lineage
FOR EACH ROW
EXECUTE FUNCTION lease._lineage_restore();

-- Extension only (generated): the statements of this script that read or
-- write leasehold's tables, call its functions or alter a table run here,
-- as the extension's owner. The script itself runs as the bootstrap
-- superuser, and the owner may have replaced any function body or put a
-- trigger, default, CHECK, index expression, policy or rule on any table;
-- run as the owner, that code has no more rights than the role that wrote
-- it. The function below exists only inside this script's transaction.
CREATE FUNCTION lease._extension_step_as_owner()
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $extension_step$
BEGIN
-- (the statements that run as the owner)
END
$extension_step$;

-- Extension only (generated): the role that owns the extension owns its
-- tables, domains and functions (the one above included), as the
-- installing role owns them with the migrations. A trusted extension's
-- script runs as the bootstrap superuser, whose SECURITY DEFINER functions
-- in a schema the installing role owns would let that role run code as the
-- superuser. Ownership moves with the privileges: REVOKE ALL ... FROM
-- PUBLIC stays as the migrations leave it, and the initial privileges
-- pg_dump compares against name the new owner.
DO $$
DECLARE
    v_extension oid;
    v_owner oid;
    v_object record;
BEGIN
    SELECT e.oid, e.extowner INTO v_extension, v_owner
      FROM pg_catalog.pg_extension AS e
     WHERE e.extname OPERATOR(pg_catalog.=) 'leasehold';
    FOR v_object IN
        SELECT 'FUNCTION' AS kind, p.oid::pg_catalog.regprocedure::pg_catalog.text AS name
          FROM pg_catalog.pg_depend AS d
          JOIN pg_catalog.pg_proc AS p ON p.oid OPERATOR(pg_catalog.=) d.objid
         WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
           AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
           AND d.refobjid OPERATOR(pg_catalog.=) v_extension
           AND d.deptype OPERATOR(pg_catalog.=) 'e'
           AND p.proowner OPERATOR(pg_catalog.<>) v_owner
        UNION ALL
        SELECT 'TABLE', c.oid::pg_catalog.regclass::pg_catalog.text
          FROM pg_catalog.pg_depend AS d
          JOIN pg_catalog.pg_class AS c ON c.oid OPERATOR(pg_catalog.=) d.objid
         WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
           AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
           AND d.refobjid OPERATOR(pg_catalog.=) v_extension
           AND d.deptype OPERATOR(pg_catalog.=) 'e'
           AND (c.relkind OPERATOR(pg_catalog.=) 'r' OR c.relkind OPERATOR(pg_catalog.=) 'v')
           AND c.relowner OPERATOR(pg_catalog.<>) v_owner
        UNION ALL
        SELECT 'DOMAIN', t.oid::pg_catalog.regtype::pg_catalog.text
          FROM pg_catalog.pg_depend AS d
          JOIN pg_catalog.pg_type AS t ON t.oid OPERATOR(pg_catalog.=) d.objid
         WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_type'::pg_catalog.regclass
           AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
           AND d.refobjid OPERATOR(pg_catalog.=) v_extension
           AND d.deptype OPERATOR(pg_catalog.=) 'e'
           AND t.typtype OPERATOR(pg_catalog.=) 'd'
           AND t.typowner OPERATOR(pg_catalog.<>) v_owner
    LOOP
        EXECUTE pg_catalog.format('ALTER %s %s OWNER TO %I', v_object.kind, v_object.name,
                                  pg_catalog.pg_get_userbyid(v_owner));
        -- Records the object's privileges again, now under its new owner, as
        -- its initial privileges (pg_init_privs): ALTER ... OWNER does not
        -- update them before PostgreSQL 17, and pg_dump compares against
        -- them, so a dump would otherwise GRANT ALL to the owner. Revoking a
        -- grant option PUBLIC cannot hold changes nothing else.
        EXECUTE pg_catalog.format('REVOKE GRANT OPTION FOR ALL ON %s %s FROM PUBLIC', v_object.kind, v_object.name);
    END LOOP;
END
$$;

SELECT lease._extension_step_as_owner();
DROP FUNCTION lease._extension_step_as_owner();
