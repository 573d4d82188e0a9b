-- Removes the functions of leases (up.sql), newest first.
DROP FUNCTION IF EXISTS lease.generation();
DROP FUNCTION IF EXISTS lease.why_refused(text, text, bigint);
DROP FUNCTION IF EXISTS lease.key_state(text);
DROP FUNCTION IF EXISTS lease.inspect(text);
DROP FUNCTION IF EXISTS lease.release(text, text, bigint);
DROP FUNCTION IF EXISTS lease.renew(text, text, bigint, interval);
DROP FUNCTION IF EXISTS lease.acquire(text, text, interval, interval);
DROP FUNCTION IF EXISTS lease._acquire_settle(bytea, text, text, interval, interval);
DROP FUNCTION IF EXISTS lease._raise_wait_timeout(text, interval, text);
DROP FUNCTION IF EXISTS lease._limit_lock_wait(interval);
DROP FUNCTION IF EXISTS lease._lock_budget(interval);
