-- Removes the batch calls. No table or other function was changed.
DROP FUNCTION IF EXISTS lease.release_many(text[], text, bigint[], bytea[]);
DROP FUNCTION IF EXISTS lease.renew_many(text[], text, bigint[], interval, bytea[]);
DROP FUNCTION IF EXISTS lease._raise_forbidden_many(text, text[]);
DROP FUNCTION IF EXISTS lease._check_many_keys(text, text[], bigint[], bytea[]);
DROP FUNCTION IF EXISTS lease._many_violations(text[], bigint[], bytea[]);
DROP FUNCTION IF EXISTS lease._many_shape_ok(text[], bigint[], bytea[]);
