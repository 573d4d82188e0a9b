-- Removes the functions of guards (up.sql), newest first.
DROP FUNCTION IF EXISTS lease.inspect_guard(text);
DROP FUNCTION IF EXISTS lease.fence(text, text, bigint);
DROP FUNCTION IF EXISTS lease.renew_admit(text, text, text, bigint, interval);
DROP FUNCTION IF EXISTS lease.admit_held(text, text, text, bigint);
DROP FUNCTION IF EXISTS lease.check_held(text, text, bigint);
DROP FUNCTION IF EXISTS lease.admit(text, text, bigint);
DROP FUNCTION IF EXISTS lease._check_held(text, text, bigint);
DROP FUNCTION IF EXISTS lease._admit(text, text, bigint);
DROP FUNCTION IF EXISTS lease._shown_key(text);
DROP FUNCTION IF EXISTS lease._raise_not_granted(text, text, bigint, bigint);
DROP FUNCTION IF EXISTS lease._raise_not_held(text, text, bigint, text, text, bigint);
DROP FUNCTION IF EXISTS lease._raise_wrong_key(text, text, text);
DROP FUNCTION IF EXISTS lease._raise_stale(text, bigint, bigint);
