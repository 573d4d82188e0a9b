-- What the other files share: lh_test.raised(statement) runs a statement
-- that should fail and shows what it raised, SQLSTATE, the stable name in
-- CONSTRAINT (what clients branch on), the message and the DETAIL when the
-- message does not already say it, in a form that is the same on every
-- PostgreSQL major (no source locations). Run on a new database.
CREATE SCHEMA IF NOT EXISTS lh_test;
GRANT USAGE ON SCHEMA lh_test TO PUBLIC;
CREATE OR REPLACE FUNCTION lh_test.raised(statement text)
RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    v_state text;
    v_constraint text;
    v_message text;
    v_detail text;
BEGIN
    EXECUTE statement;
    RETURN 'no error';
EXCEPTION WHEN OTHERS OR query_canceled THEN
    GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_constraint = CONSTRAINT_NAME,
                            v_message = MESSAGE_TEXT, v_detail = PG_EXCEPTION_DETAIL;
    RETURN v_state || ' ' || coalesce(nullif(v_constraint, ''), '-') || ': ' || v_message
        || CASE WHEN v_detail = '' OR strpos(v_message, v_detail) > 0 THEN '' ELSE ' / ' || v_detail END;
END;
$$;
SELECT lh_test.raised('SELECT 1/0');
