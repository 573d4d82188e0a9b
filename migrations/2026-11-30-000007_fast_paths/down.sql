-- Removes the fast paths. No table or other function was changed.
DROP VIEW IF EXISTS lease.fast_release;
DROP VIEW IF EXISTS lease.fast_renew;
DROP VIEW IF EXISTS lease.fast_acquire;
DROP FUNCTION IF EXISTS lease._fast_wake(bytea);
DROP FUNCTION IF EXISTS lease._fast_allowed(text);
