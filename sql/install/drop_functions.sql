-- leasehold: what undoes the files of functions (the functions step's
-- down, for uninstall and Diesel's revert): every function of schema
-- lease but the migrations' own lease._drop_default_grants, whichever
-- version of the files created them, in one statement, so that functions
-- that call each other go together.
SET LOCAL lock_timeout = '5s';
DO $$
DECLARE
    v_list text;
BEGIN
    SELECT pg_catalog.string_agg(p.oid::pg_catalog.regprocedure::pg_catalog.text, ', ') INTO v_list
      FROM pg_catalog.pg_proc AS p
     WHERE p.pronamespace OPERATOR(pg_catalog.=) pg_catalog.to_regnamespace('lease')
       AND p.proname OPERATOR(pg_catalog.<>) '_drop_default_grants';
    IF v_list IS NOT NULL THEN
        EXECUTE 'DROP FUNCTION ' OPERATOR(pg_catalog.||) v_list;
    END IF;
END
$$;
