-- leasehold: the checks leasehold::install runs before its bookkeeping and
-- the migrations, beside the two it takes from migration 1 (the server's
-- version and the schema's owner, which Diesel's runner runs there too).
-- Only the installer runs these: a migration cannot know whether it runs
-- inside a new schema. src/install.rs picks each statement by the
-- CONSTRAINT name it raises; every check refuses with SQLSTATE 42501 and
-- changes nothing.

-- The role must be able to create schema lease, unless it exists
-- (lease_install_not_permitted).
DO $$
BEGIN
    IF pg_catalog.to_regnamespace('lease') IS NULL
       AND NOT pg_catalog.has_database_privilege(pg_catalog.current_database(), 'CREATE') THEN
        RAISE EXCEPTION 'role % may not create schema lease in database %', current_user, pg_catalog.current_database()
            USING ERRCODE = '42501',
                  CONSTRAINT = 'lease_install_not_permitted',
                  DETAIL = 'role=' OPERATOR(pg_catalog.||) current_user
                           OPERATOR(pg_catalog.||) ' database=' OPERATOR(pg_catalog.||) pg_catalog.current_database(),
                  HINT = 'GRANT CREATE ON DATABASE to the installing role, or install as the database owner; nothing was installed.';
    END IF;
END
$$;

-- Schema lease must be one no other role can put code into: an object
-- another role owns, CREATE or TRIGGER held by another role. The
-- migrations would run such code as the installer. A schema this
-- transaction created is skipped (lease_schema_not_private).
DO $$
DECLARE
    v_schema oid := pg_catalog.to_regnamespace('lease');
    v_me oid := (SELECT r.oid FROM pg_catalog.pg_roles AS r WHERE r.rolname OPERATOR(pg_catalog.=) current_user);
    v_what text;
BEGIN
    IF (SELECT n.xmin FROM pg_catalog.pg_namespace AS n WHERE n.oid OPERATOR(pg_catalog.=) v_schema)
       OPERATOR(pg_catalog.=) pg_catalog.xid(pg_catalog.pg_current_xact_id()) THEN
        RETURN;
    END IF;
    SELECT x.what INTO v_what FROM (
        SELECT pg_catalog.format('%s is owned by role %s',
                                 pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid),
                                 pg_catalog.pg_get_userbyid(s.refobjid)) AS what
          FROM pg_catalog.pg_depend AS d
          JOIN pg_catalog.pg_shdepend AS s
            ON s.classid OPERATOR(pg_catalog.=) d.classid AND s.objid OPERATOR(pg_catalog.=) d.objid
           AND s.deptype OPERATOR(pg_catalog.=) 'o'
           AND s.dbid OPERATOR(pg_catalog.=) (SELECT b.oid FROM pg_catalog.pg_database AS b
                                               WHERE b.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
         WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_namespace'::pg_catalog.regclass
           AND d.refobjid OPERATOR(pg_catalog.=) v_schema
           AND d.deptype OPERATOR(pg_catalog.=) 'n'
           AND s.refobjid OPERATOR(pg_catalog.<>) v_me
        UNION ALL
        SELECT pg_catalog.format('role %s holds CREATE on schema lease',
                                 COALESCE(pg_catalog.pg_get_userbyid(NULLIF(a.grantee, 0)), 'PUBLIC'))
          FROM pg_catalog.pg_namespace AS n, pg_catalog.aclexplode(n.nspacl) AS a
         WHERE n.oid OPERATOR(pg_catalog.=) v_schema
           AND a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'
           AND a.grantee OPERATOR(pg_catalog.<>) n.nspowner
        UNION ALL
        SELECT pg_catalog.format('role %s holds TRIGGER on table %s',
                                 COALESCE(pg_catalog.pg_get_userbyid(NULLIF(a.grantee, 0)), 'PUBLIC'),
                                 c.oid::pg_catalog.regclass)
          FROM pg_catalog.pg_class AS c, pg_catalog.aclexplode(c.relacl) AS a
         WHERE c.relnamespace OPERATOR(pg_catalog.=) v_schema
           AND a.privilege_type OPERATOR(pg_catalog.=) 'TRIGGER'
           AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
    ) AS x
    LIMIT 1;
    IF v_what IS NOT NULL THEN
        RAISE EXCEPTION 'another role can put code into schema lease (%), which the install would run as role %', v_what, current_user
            USING ERRCODE = '42501',
                  CONSTRAINT = 'lease_schema_not_private',
                  DETAIL = 'what=' OPERATOR(pg_catalog.||) v_what,
                  HINT = 'Drop that object or revoke that privilege, or install as the role that owns the schema; nothing was installed.';
    END IF;
END
$$;
