-- leasehold: the refusals the extension's install script adds to migration
-- 1 (src/admin/extension.rs picks each by the CONSTRAINT name it raises).
-- Its own schema-owner check is migration 1's, which judges the
-- extension's owner there.

-- Never take over an install by the migrations: the two install paths are
-- never mixed in one database (lease_installed_by_migrations). Runs where
-- migration 1 creates schema lease, which the extension creates itself.
DO $$
BEGIN
    IF pg_catalog.to_regclass('lease.schema_migrations') IS NOT NULL THEN
        RAISE EXCEPTION 'leasehold is already installed in this database by its migrations (lease.schema_migrations exists); CREATE EXTENSION leasehold cannot take over that install'
            USING ERRCODE = '55000',
                  CONSTRAINT = 'lease_installed_by_migrations',
                  HINT = 'Keep upgrading with leasehold::install (or `leasehold install`), or uninstall it first; the two install paths are never mixed in one database.';
    END IF;
END
$$;

-- Schema lease must be empty, so that the scripts meet only objects they
-- created (lease_schema_not_empty). Runs after migration 1's owner check.
DO $$
DECLARE
    v_object text;
BEGIN
    SELECT pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid) INTO v_object
      FROM pg_catalog.pg_depend AS d
     WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_namespace'::pg_catalog.regclass
       AND d.refobjid OPERATOR(pg_catalog.=) (SELECT n.oid FROM pg_catalog.pg_namespace AS n
                                               WHERE n.nspname OPERATOR(pg_catalog.=) 'lease')
       AND d.classid OPERATOR(pg_catalog.<>) 'pg_catalog.pg_extension'::pg_catalog.regclass
     LIMIT 1;
    IF v_object IS NOT NULL THEN
        RAISE EXCEPTION 'schema lease already holds objects that CREATE EXTENSION leasehold did not create (%)', v_object
            USING ERRCODE = '42P07',
                  CONSTRAINT = 'lease_schema_not_empty',
                  DETAIL = 'object=' OPERATOR(pg_catalog.||) v_object,
                  HINT = 'Drop those objects or the schema first: the extension creates every object of schema lease itself, so that its scripts never run code another role put there.';
    END IF;
END
$$;
