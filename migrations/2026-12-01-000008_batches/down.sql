-- Removes the functions of batches (up.sql), newest first.
DROP FUNCTION IF EXISTS lease.renew_group(bigint, text, interval);
DROP FUNCTION IF EXISTS lease.join_group(text[], text, bigint[], interval, bytea[]);
DROP FUNCTION IF EXISTS lease.release_many(text[], text, bigint[], bytea[]);
DROP FUNCTION IF EXISTS lease.renew_many(text[], text, bigint[], interval, bytea[]);
DROP FUNCTION IF EXISTS lease._raise_forbidden_many(text, text[]);
DROP FUNCTION IF EXISTS lease._check_many_keys(text, text[], bigint[], bytea[]);
DROP FUNCTION IF EXISTS lease._many_violations(text[], bigint[], bytea[]);
DROP FUNCTION IF EXISTS lease._many_shape_ok(text[], bigint[], bytea[]);
