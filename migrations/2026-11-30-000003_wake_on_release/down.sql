-- Removes wake-on-release: the notification trigger, the waiter registry
-- and the flag column. The lease functions were never redefined.
DROP TRIGGER IF EXISTS notify_released ON lease.leases;
DROP FUNCTION IF EXISTS lease._notify_released();
DROP FUNCTION IF EXISTS lease._waiter_reset();
DROP FUNCTION IF EXISTS lease._waiter_unwatch(text);
DROP FUNCTION IF EXISTS lease._waiter_watch(text);
DROP FUNCTION IF EXISTS lease._waiter_unflag(bytea);
DROP TABLE IF EXISTS lease.waiters;
ALTER TABLE lease.leases DROP COLUMN IF EXISTS watched;
